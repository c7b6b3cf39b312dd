// Where a training step is, as checkpointed regions tell it: a region's
// forward begins and ends, its recomputation begins and ends, its frame lets
// go of what it kept, and whether its forward kept outputs. sac/lab/peak.h places a
// step's allocations by these events. The checkpoint floor calls them on the
// thread that runs the region; a listener sees its own thread only (a
// recomputation on autograd's device threads is not seen).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace sac::detail {

class RegionEvents {
 public:
  virtual ~RegionEvents() = default;
  // `region` names one region (its frame) while the region lives.
  virtual void forward_began(const void* region) = 0;
  virtual void forward_ended(const void* region) = 0;
  // Inside the recomputation's isolation (sac/dispatch's IsolationGuard):
  // observers added here, and removed by recomputation_ended, see its ops.
  virtual void recomputation_began(const void* region) = 0;
  // After what the recomputation did not take was released.
  virtual void recomputation_ended(const void* region) = 0;
  // The region's frame let go of what its contexts kept (its graph was
  // freed: after backward, or at once when the forward saved nothing).
  virtual void released(const void* region) = 0;
  // The frame of `region` holds `input` for its recomputation, which a
  // plain region would not: `frame_handles` of the handles on the input's
  // TensorImpl are the frame's (Note [A region left unchecked], plan_trace.cpp).
  virtual void input_held(const void* /*region*/, const at::Tensor& /*input*/,
                          int64_t /*frame_handles*/) {}
  // The forward of `region` saved `saved` for backward, held by `holder`
  // until autograd lets go of it (its node ran, or its graph died).
  virtual void saved(const void* /*region*/, const at::Tensor& /*saved*/,
                     std::weak_ptr<const void> /*holder*/) {}
  // The frame of `region` reported every input it holds (input_held) and
  // every save (saved): how the region would run plainly is known.
  virtual void heard_whole(const void* /*region*/) {}
  // A selective forward ended keeping the outputs of `calls` op calls for
  // its recomputation (some perhaps dropped already, modified in place).
  virtual void outputs_kept(size_t calls) = 0;
  // Whether the thread's regions run without checkpointing while this
  // listener hears them: sac::measure_step_phases measures the plain step
  // so. A region that cannot (PyTorch's own checkpoint, under sac's
  // contexts) still begins, and the listener hears that it did.
  virtual bool regions_run_plainly() const { return false; }
};

// This thread's listener, or nullptr.
RegionEvents* region_events();

// Whether this thread's listener asks regions to run plainly.
bool regions_run_plainly();

// While alive, `listener` hears this thread's regions (the previous one
// again afterwards).
class RegionEventsGuard {
 public:
  explicit RegionEventsGuard(RegionEvents* listener);
  ~RegionEventsGuard();
  RegionEventsGuard(const RegionEventsGuard&) = delete;
  RegionEventsGuard& operator=(const RegionEventsGuard&) = delete;

 private:
  RegionEvents* previous_;
};

}  // namespace sac::detail
