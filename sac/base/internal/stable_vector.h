// An append-only sequence whose elements never move.
//
// The op cache appends an entry per kept call, and large entries moved by a
// growing std::vector cost more than making them; std::deque allocates a
// block per two of them. StableVector constructs each element in place in
// segments that double in size (the first under 1 KiB), so a reference stays
// valid until clear(), and n elements take about log2(n) allocations.
//
//   StableVector<Entry> entries;
//   Entry& entry = entries.emplace_back(args...);
//   for (Entry& e : entries) {}  // in the order appended
#pragma once

#include <c10/util/Exception.h>

#include <cstddef>
#include <memory>
#include <new>
#include <utility>

namespace sac::detail {

template <class T>
class StableVector {
 public:
  // The first segment's size, a power of two (an index splits with shifts).
  static constexpr size_t kFirst = [] {
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
    if (next_ == end_) {
      add_segment();
    }
    T* element = new (next_) T(std::forward<Args>(args)...);
    ++next_;
    ++size_;
    return *element;
  }

  T& operator[](size_t i) {
    // Segment k holds kFirst << k elements, from kFirst * (2^k - 1) on.
    const size_t k = segment_of(i);
    return segments_[k][i - kFirst * ((size_t{1} << k) - 1)];
  }
  const T& operator[](size_t i) const { return const_cast<StableVector&>(*this)[i]; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  void clear() {
    for (size_t i = size_; i > 0; --i) {
      (*this)[i - 1].~T();
    }
    std::allocator<T> allocator;
    for (size_t k = 0; k < segment_count_; ++k) {
      allocator.deallocate(segments_[k], kFirst << k);
    }
    size_ = segment_count_ = 0;
    next_ = end_ = nullptr;
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
  static size_t segment_of(size_t i) {
    return static_cast<size_t>(63 - __builtin_clzll(i / kFirst + 1));
  }
  void add_segment() {
    TORCH_CHECK(segment_count_ < kMaxSegments, "sac: a StableVector is full");
    const size_t n = kFirst << segment_count_;
    next_ = segments_[segment_count_++] = std::allocator<T>().allocate(n);  // uninitialized
    end_ = next_ + n;
  }

  // Each segment doubles: 40 hold more than any memory.
  static constexpr size_t kMaxSegments = 40;
  T* segments_[kMaxSegments] = {};
  size_t segment_count_ = 0;
  size_t size_ = 0;
  T* next_ = nullptr;  // where the next element goes, in the last segment
  T* end_ = nullptr;   // the last segment's end
};

}  // namespace sac::detail
