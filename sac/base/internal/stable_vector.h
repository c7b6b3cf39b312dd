// An append-only sequence whose elements never move.
//
// The op cache appends an entry per saved call, and large entries moved by a
// growing std::vector cost more than making them; std::deque allocates a
// block per two of them. StableVector allocates chunks of under 1 KiB and
// constructs each element in place, so a reference stays valid until
// clear(). The chunks stay below glibc's large requests, which first merge
// every freed small block (malloc_consolidate): an op's own outputs leave
// many of those.
//
//   StableVector<Entry> entries;
//   Entry& entry = entries.emplace_back(args...);
//   for (Entry& e : entries) {}  // in the order appended
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <utility>
#include <vector>

namespace sac {

template <class T>
class StableVector {
 public:
  // A power of two (the index splits with a shift and a mask).
  static constexpr size_t kChunk = [] {
    size_t n = 1;
    while (2 * n * sizeof(T) <= 992) {
      n *= 2;
    }
    return n;
  }();

  StableVector() = default;
  StableVector(const StableVector&) = delete;
  StableVector& operator=(const StableVector&) = delete;
  ~StableVector() { clear(); }

  template <class... Args>
  T& emplace_back(Args&&... args) {
    if (size_ == chunks_.size() * kChunk) {
      chunks_.push_back(std::unique_ptr<Chunk>(new Chunk));  // uninitialized
    }
    T* slot = chunks_[size_ / kChunk]->at(size_ % kChunk);
    new (slot) T(std::forward<Args>(args)...);
    ++size_;
    return *slot;
  }

  T& operator[](size_t i) { return *chunks_[i / kChunk]->at(i % kChunk); }
  const T& operator[](size_t i) const { return *chunks_[i / kChunk]->at(i % kChunk); }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  void clear() {
    for (size_t i = size_; i > 0; --i) {
      (*this)[i - 1].~T();
    }
    size_ = 0;
    chunks_.clear();
  }

  template <class Self, class Element>
  class Iterator {
   public:
    Iterator(Self* vector, size_t i) : vector_(vector), i_(i) {}
    Element& operator*() const { return (*vector_)[i_]; }
    Iterator& operator++() {
      ++i_;
      return *this;
    }
    bool operator!=(const Iterator& other) const { return i_ != other.i_; }

   private:
    Self* vector_;
    size_t i_;
  };
  Iterator<StableVector, T> begin() { return {this, 0}; }
  Iterator<StableVector, T> end() { return {this, size_}; }
  Iterator<const StableVector, const T> begin() const { return {this, 0}; }
  Iterator<const StableVector, const T> end() const { return {this, size_}; }

 private:
  struct Chunk {
    alignas(T) unsigned char bytes[kChunk * sizeof(T)];
    T* at(size_t i) { return std::launder(reinterpret_cast<T*>(bytes) + i); }
  };
  std::vector<std::unique_ptr<Chunk>> chunks_;
  size_t size_ = 0;
};

}  // namespace sac
