// How a checkpoint frame computes again the tensors its forward saved.
//
// Two ways, one interface: `FunctionRerun` (function_rerun.h) calls the
// checkpointed function again, with autograd, as PyTorch does; the region
// guard's `RegionReplay` (region.h) replays the aten calls it recorded, below
// autograd. Either fills the frame's holders in the order the forward saved
// them, through CheckpointFrame::save_recomputed.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

namespace sac::detail {

class CheckpointFrame;

class Recomputation {
 public:
  virtual ~Recomputation() = default;

  // The forward saved `packed`: it becomes the frame's next holder.
  virtual void saved(const at::Tensor& packed) {}

  // One recomputation, for one backward pass.
  class Pass {
   public:
    virtual ~Pass() = default;
    // Runs under the forward's RNG and autocast state and the recompute
    // context; fills the holders (it may stop early by exception).
    virtual void run() = 0;
  };
  // Starts a pass: unpacks what it reads from outside the region. That may
  // recompute an enclosing region, so the frame calls it before it restores
  // this region's forward state and enters its recompute context.
  virtual std::unique_ptr<Pass> begin(CheckpointFrame& frame, int64_t graph_task) = 0;

  // The region's graph is gone: drop what only recomputation needed.
  virtual void release() {}

  // Whether the region overwrites whole, before reading it, the tensor whose
  // version counter is `counter` (version_counter_identity; Note
  // [Overwritten before read]): a recomputation writes it again, and so
  // changes its version, as its forward did.
  virtual bool overwrites_before_reading(const void* counter) const { return false; }
};

}  // namespace sac::detail
