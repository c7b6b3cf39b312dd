// Where tensors kept for backward can wait off their device, and how they
// come back: the memory behind sac::OffloadGuard (sac/offload/offload.h) and
// behind a policy's offload answers (sac/policy/checkpoint_policy.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <vector>

namespace sac {

// The default, host_memory(), moves accelerator tensors to pinned host
// memory and leaves CPU tensors where they are; tests and special memories
// inject their own.
class CopyTarget {
 public:
  // What copy_back needs of the tensor copied out: where it lived and its
  // strides (autograd's kernels can round differently on other strides, so
  // it comes back with them).
  struct Origin {
    c10::Device device = c10::kCPU;
    std::vector<int64_t> strides;
    static Origin of(const at::Tensor& t) { return {t.device(), t.strides().vec()}; }
  };

  // A copy back started ahead of its use (a prefetch), still on its way.
  class Incoming {
   public:
    virtual ~Incoming() = default;
    // The tensor, ready for the work queued on its device once this returns.
    virtual at::Tensor take() = 0;
  };

  // For writing copy targets: `t` with its broadcast dimensions (stride 0)
  // cut to one element, what a copy with t's strides needs to hold (copy_
  // into a broadcast tensor fails); `copy.expand(t.sizes())` has t's sizes
  // and strides again.
  static at::Tensor without_broadcast(const at::Tensor& t);

  virtual ~CopyTarget() = default;
  // Whether `t` goes to the target at all.
  virtual bool accepts(const at::Tensor& t) const = 0;
  // A copy of `t`'s values, with its sizes, in the target's memory (its
  // strides are the target's choice: a dense copy holds no gaps). The caller
  // drops `t` right after: a target that copies asynchronously must keep
  // `t`'s memory from being reused before its copy has read it.
  virtual at::Tensor copy_out(const at::Tensor& t) = 0;
  // `copy` back on `from.device`, with `from.strides`: an equal tensor,
  // ready for the work queued on the device once this returns.
  virtual at::Tensor copy_back(const at::Tensor& copy, const Origin& from) = 0;
  // copy_back in two parts, so that the copy overlaps the work queued
  // before `take()`; by default it copies back at once.
  virtual std::unique_ptr<Incoming> start_copy_back(const at::Tensor& copy, const Origin& from);
};

// Pinned host memory for an accelerator's tensors (CUDA, HIP, XPU; strided):
// CPU, meta and sparse tensors stay where they are. The host holds dense
// copies of the elements: a broadcast (stride 0) dimension copied once, a
// view with gaps without them. Copies out run on a side stream per device,
// which waits for the work queued before (it made the tensor) but not the
// work queued after, which overlaps; the device memory is handed back to the
// allocator at once and reused only after the copy read it. Copies back run
// on a second side stream (never queued behind later copies out), after the
// copies out before them, into memory allocated from that stream's pool with
// the tensor's strides; the current stream waits for a copy back when it is
// taken, so a prefetch overlaps the work queued until then.
std::shared_ptr<CopyTarget> host_memory();

}  // namespace sac
