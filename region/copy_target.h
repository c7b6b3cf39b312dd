// Where tensors kept for backward can wait off their device, and how they
// come back: the memory behind sac::OffloadGuard (sac/offload/offload.h) and
// behind a policy's offload answers (sac/policy/checkpoint_policy.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>

namespace sac {

// The default, host_memory(), moves accelerator tensors to pinned host
// memory and leaves CPU tensors where they are; tests and special memories
// inject their own.
class CopyTarget {
 public:
  virtual ~CopyTarget() = default;
  // Whether `t` goes to the target at all.
  virtual bool accepts(const at::Tensor& t) const = 0;
  // A copy of `t`, with its sizes and strides, in the target's memory. The
  // caller drops `t` right after: a target that copies asynchronously must
  // keep `t`'s memory from being reused before its copy has read it.
  virtual at::Tensor copy_out(const at::Tensor& t) = 0;
  // `copy` back on `device`, with its sizes and strides: an equal tensor,
  // ready for the work queued after this call on `device`.
  virtual at::Tensor copy_back(const at::Tensor& copy, c10::Device device) = 0;
};

// Pinned host memory. An accelerator's copies run on a side stream of its
// own, one per device: a copy out waits for the work queued before it (which
// made the tensor) but not the work queued after, which overlaps with it;
// the device memory is handed back to the allocator at once and reused only
// after the copy read it. A copy back is queued on the side stream, and the
// device's current stream waits for it.
std::shared_ptr<CopyTarget> host_memory();

}  // namespace sac
