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

// Pinned host memory for an accelerator's tensors (CUDA, HIP, XPU; strided):
// CPU, meta and sparse tensors stay where they are. Copies keep the sizes
// and strides (autograd's kernels can round differently on other strides):
// a broadcast (stride 0) dimension is copied once and expanded again; a view
// with gaps is copied with its span. Copies out run on a side
// stream per device, which waits for the work queued before (it made the
// tensor) but not the work queued after, which overlaps; the device memory
// is handed back to the allocator at once and reused only after the copy
// read it. Copies back run on a second side stream, into memory allocated
// from that stream's pool, and the current stream waits for them.
std::shared_ptr<CopyTarget> host_memory();

class DeviceOps;
// The same through `ops` (sac/region/device_ops.h): tests check the order of
// its operations with a fake on the CPU.
std::shared_ptr<CopyTarget> host_memory(std::shared_ptr<DeviceOps> ops);

// For writing copy targets: `t` with its broadcast dimensions (stride 0)
// cut to one element, what a copy with t's strides needs to hold (copy_
// into a broadcast tensor fails); `copy.expand(t.sizes())` has t's sizes
// and strides again.
at::Tensor without_broadcast(const at::Tensor& t);

}  // namespace sac
