// Where the op cache finds a call: per op, its calls in forward order, each
// the index of its entry (sac/cache/internal/cache_entry.h) or none.
//
// The recomputation addresses a call by (op, call index), so the table is
// keyed by op and numbers each op's calls on their own. A recompute call needs
// no entry unless a late decision may still keep it; the calls of an op before
// its first entry are only counted, so an op a policy never keeps costs a
// counter. The latest op looked up is remembered: the caching mode asks for the
// count of an op's calls, then appends one.
//
//   CallTable table;
//   table.append(op, CallTable::kNoEntry);        // call 0: recomputed
//   table.append(op, 7);                          // call 1: entry 7
//   table.calls_so_far(op);                       // 2
//   table.find(op, 1);                            // {known, entry 7}
#pragma once

#include <sac/base/internal/pointer_map.h>
#include <sac/base/internal/stable_vector.h>
#include <sac/dispatch/internal/boxed.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include <cstddef>
#include <cstdint>

namespace sac::detail {

class CallTable {
 public:
  // A call entered without an entry (a recompute call nobody may keep late).
  static constexpr uint32_t kNoEntry = UINT32_MAX;

  // Enters the next call of `op`, with entry `entry` or kNoEntry, and
  // returns its call index. (Inline, as the rest of the table: the caching
  // mode enters every call a policy decides about.)
  size_t append(const c10::OperatorHandle& op, uint32_t entry) {
    OpCalls& calls = calls_of(op);
    const size_t call_index = calls.size();
    calls.push_back(entry);
    ++calls_;
    return call_index;
  }
  // The number of calls of `op` entered so far: the index of the next one.
  size_t calls_so_far(const c10::OperatorHandle& op) const {
    const OpCalls* calls = find_calls(op);
    return calls == nullptr ? 0 : calls->size();
  }

  struct Found {
    bool known = false;         // the call was entered
    uint32_t entry = kNoEntry;  // its entry, if it has one
  };
  // Call `call_index` of `op`: unknown past the calls entered.
  Found find(const c10::OperatorHandle& op, size_t call_index) const {
    const OpCalls* calls = find_calls(op);
    if (calls == nullptr || call_index >= calls->size()) {
      return {};
    }
    return {true, (*calls)[call_index]};
  }

  // Calls entered, of all ops.
  size_t calls() const { return calls_; }
  bool empty() const { return calls_ == 0; }
  void clear() {
    ops_.clear();
    latest_key_ = nullptr;
    latest_calls_ = nullptr;
    calls_ = 0;
  }

 private:
  // One op's calls.
  class OpCalls {
   public:
    size_t size() const { return count_; }
    uint32_t operator[](size_t call_index) const {
      return call_index < first_entry_ ? kNoEntry : entries_[call_index - first_entry_];
    }
    void push_back(uint32_t entry) {
      if (entries_.empty() && entry == kNoEntry) {
        first_entry_ = ++count_;
        return;
      }
      entries_.emplace_back(entry);
      ++count_;
    }

   private:
    size_t count_ = 0;
    size_t first_entry_ = 0;          // calls before it have no entry
    StableVector<uint32_t> entries_;  // from first_entry_ on
  };

  // `op`'s calls: calls_of adds them (empty) if absent, find_calls returns
  // null. Both remember the op found.
  OpCalls& calls_of(const c10::OperatorHandle& op) {
    const void* key = op_key(op);
    if (key != latest_key_) {
      latest_calls_ = &ops_[key];
      latest_key_ = key;
    }
    return *latest_calls_;
  }
  const OpCalls* find_calls(const c10::OperatorHandle& op) const {
    const void* key = op_key(op);
    if (key == latest_key_) {
      return latest_calls_;
    }
    OpCalls* calls = const_cast<PointerMap<OpCalls>&>(ops_).find(key);
    if (calls != nullptr) {
      latest_key_ = key;
      latest_calls_ = calls;
    }
    return calls;
  }

  PointerMap<OpCalls> ops_;                   // by detail::op_key
  mutable const void* latest_key_ = nullptr;  // see calls_of
  mutable OpCalls* latest_calls_ = nullptr;
  size_t calls_ = 0;
};

}  // namespace sac::detail
