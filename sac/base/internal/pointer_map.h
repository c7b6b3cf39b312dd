// A hash map from an address to a value, for the per-op hot path.
//
// sac looks up an op (its dispatcher entry) or a storage by address for
// nearly every op a region runs, and adds one entry per kept output:
// `std::unordered_map` allocates a node per entry and divides by a prime per
// lookup. This one keeps the entries in one array, open addressing with
// linear probing on a power-of-two table, so a lookup is a multiply, a
// shift and usually one compare, and an insertion allocates only when the
// table doubles. The values live apart and never move. Erasing shifts the
// following entries back (no tombstones).
//
//   PointerMap<size_t> counts;
//   ++counts[storage];                        // inserts 0 first if absent
//   if (size_t* n = counts.find(storage)) {}  // null if absent
//
// A pointer to a value stays valid until its key is erased (one of at most
// 8 trivially copyable bytes, kept in the table: until the next insertion).
// Keys must not be null.
#pragma once

#include <sac/base/internal/stable_vector.h>

#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

namespace sac::detail {

template <class V>
class PointerMap {
 public:
  V* find(const void* key) {
    if (size_ == 0) {
      return nullptr;
    }
    for (size_t i = home(key);; i = next(i)) {
      Entry& entry = entries_[i];
      if (entry.key == key) {
        return &value_of(entry);
      }
      if (entry.key == nullptr) {
        return nullptr;
      }
    }
  }
  const V* find(const void* key) const { return const_cast<PointerMap*>(this)->find(key); }

  // The value of `key`, value-initialized first if absent.
  V& operator[](const void* key) { return try_emplace(key).first; }

  // The value of `key` and whether it was absent (and is now V()).
  std::pair<V&, bool> try_emplace(const void* key) {
    if (V* found = find(key)) {
      return {*found, false};
    }
    return {insert(key), true};
  }

  // Removes `key` if present.
  void erase(const void* key) {
    if (size_ == 0) {
      return;
    }
    size_t hole = home(key);
    while (entries_[hole].key != key) {
      if (entries_[hole].key == nullptr) {
        return;
      }
      hole = next(hole);
    }
    if constexpr (!kInline) {
      values_[entries_[hole].value] = V();  // let go of what it holds now
      free_.push_back(entries_[hole].value);
    }
    // Backward shift: an entry after the hole moves into it unless its home
    // lies cyclically in (hole, entry], where it would no longer be found.
    for (size_t i = next(hole);; i = next(i)) {
      const Entry entry = entries_[i];
      if (entry.key == nullptr) {
        break;
      }
      const size_t h = home(entry.key);
      const bool stays = hole < i ? (hole < h && h <= i) : (hole < h || h <= i);
      if (!stays) {
        entries_[hole] = entry;
        hole = i;
      }
    }
    entries_[hole] = Entry();
    --size_;
  }

  // Calls f(key, value) for every entry, in no particular order.
  template <class F>
  void for_each(F&& f) {
    for (const Entry& entry : entries_) {
      if (entry.key != nullptr) {
        f(entry.key, value_of(entry));
      }
    }
  }
  template <class F>
  void for_each(F&& f) const {
    for (const Entry& entry : entries_) {
      if (entry.key != nullptr) {
        f(entry.key, value_of(entry));
      }
    }
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  void clear() {
    entries_.clear();
    values_.clear();
    free_.clear();
    size_ = 0;
  }

 private:
  // The table holds small values itself, and the index of others, so that
  // growing it moves 16 bytes per entry and never a large value.
  static constexpr bool kInline = std::is_trivially_copyable_v<V> && sizeof(V) <= 8;
  struct Entry {
    const void* key = nullptr;
    std::conditional_t<kInline, V, uint32_t> value{};  // or its index in values_
  };
  V& value_of(Entry& entry) {
    if constexpr (kInline) {
      return entry.value;
    } else {
      return values_[entry.value];
    }
  }
  const V& value_of(const Entry& entry) const {
    return const_cast<PointerMap*>(this)->value_of(const_cast<Entry&>(entry));
  }

  size_t home(const void* key) const {
    // Fibonacci hashing: the high bits of the product mix every bit of the
    // address (the low ones are alignment).
    const uint64_t product = reinterpret_cast<uintptr_t>(key) * 0x9E3779B97F4A7C15ull;
    return static_cast<size_t>(product >> shift_);
  }
  size_t next(size_t i) const { return (i + 1) & (entries_.size() - 1); }

  // A new V() for `key`, which is absent.
  V& insert(const void* key) {
    TORCH_INTERNAL_ASSERT(key != nullptr, "sac: a PointerMap key must not be null");
    if ((size_ + 1) * 2 > entries_.size()) {  // at most half full: misses stop early
      grow();
    }
    size_t i = home(key);
    while (entries_[i].key != nullptr) {
      i = next(i);
    }
    Entry& entry = entries_[i];
    entry.key = key;
    if constexpr (kInline) {
      entry.value = V();
    } else if (free_.empty()) {
      entry.value = static_cast<uint32_t>(values_.size());
      values_.emplace_back();
    } else {
      entry.value = free_.back();
      free_.pop_back();
    }
    ++size_;
    return value_of(entry);
  }

  void grow() {
    std::vector<Entry> old = std::move(entries_);
    const size_t capacity = old.empty() ? 16 : old.size() * 2;
    entries_.assign(capacity, Entry());
    shift_ = 64;
    for (size_t c = capacity; c > 1; c >>= 1) {
      --shift_;
    }
    for (const Entry& entry : old) {
      if (entry.key != nullptr) {
        size_t i = home(entry.key);
        while (entries_[i].key != nullptr) {
          i = next(i);
        }
        entries_[i] = entry;
      }
    }
  }

  std::vector<Entry> entries_;
  StableVector<V> values_;  // unless kInline: never moved; erased ones are reset and reused
  std::vector<uint32_t> free_;
  size_t size_ = 0;
  unsigned shift_ = 64;
};

}  // namespace sac::detail
