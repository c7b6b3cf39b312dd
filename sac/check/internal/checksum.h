// The value check of DeterminismCheck::Values: a checksum of each tensor
// autograd saves in a region's forward, compared with the recomputation's
// as it saves the same tensor, so that the first one that differs is named
// before a wrong value reaches a gradient (or a shape error deep in
// backward).
//
// A checksum is bit for bit: equal bits give equal checksums, and a changed
// bit (one ulp, a flipped index) changes it but for a collision (64 bits).
// It is taken on the tensor's device: on the CPU by reading its memory
// (no op is dispatched), elsewhere by a few tensor ops that no sac mode,
// observer, log or profiler sees (the result stays on the device; a
// recomputation's are compared together when it ends, one synchronization
// per device).
//
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace sac::detail {

class ValueChecksum {
 public:
  // Of `t`'s values (strided tensors; others give an empty checksum, equal
  // to any: the shape check still applies).
  static ValueChecksum of(const at::Tensor& t);
  // Of all the bytes of `storage` (whichever tensors view it; none for a
  // storage without data: meta).
  static ValueChecksum of_storage(const c10::Storage& storage);
  // Compares now: one synchronization for a checksum on an accelerator.
  bool matches(const ValueChecksum& other) const;
  // Whether comparing it synchronizes (an accelerator's), so that callers
  // compare such checksums together, with first_mismatch.
  bool on_device() const { return device_.defined(); }
  // Of nothing (a tensor without values): it matches any.
  bool empty() const { return empty_; }
  // The first pair (forward, recomputed) whose checksums differ, comparing
  // those on accelerators in one synchronization per device.
  static std::optional<size_t> first_mismatch(
      const std::vector<std::pair<const ValueChecksum*, const ValueChecksum*>>& pairs);
  std::string str() const;

 private:
  bool empty_ = true;
  uint64_t host_ = 0;
  at::Tensor device_;  // two int64 sums, on the tensor's device
};

// The accelerators' path, for CPU tensors too while set (a test seam: CI
// has no accelerator).
void checksum_with_tensor_ops_for_testing(bool on);

}  // namespace sac::detail
