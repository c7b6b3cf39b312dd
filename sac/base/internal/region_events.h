// Where a training step is, as checkpointed regions tell it: a region's
// forward begins and ends, its recomputation begins. sac/lab/peak.h divides
// a step into phases by these events. The checkpoint floor calls them on the
// thread that runs the region; a listener sees its own thread only (a
// recomputation on autograd's device threads is not seen).
#pragma once

namespace sac::detail {

class RegionEvents {
 public:
  virtual ~RegionEvents() = default;
  // `region` names one region (its frame) while the region lives.
  virtual void forward_began(const void* region) = 0;
  virtual void forward_ended(const void* region) = 0;
  virtual void recomputation_began(const void* region) = 0;
};

// This thread's listener, or nullptr.
RegionEvents* region_events();

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
