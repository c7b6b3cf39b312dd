// A training step's allocations, event by event, placed among its regions'
// op calls: what sac/lab/peak.h predicts a plan's peak from.
//
// Traced with c10's memory reporting (c10::reportMemoryUsageToProfiler,
// what PyTorch's memory profiler listens to): every allocation and free of
// an allocator that reports, in the order they happen. The op calls of each
// region's forward and recomputation are placed between them (positions:
// the number of events before), with the allocations their outputs' storages
// are, so that a plan's changes to the step are changes to this list: see
// Note [A plan's trace] in plan_trace.cpp.
#pragma once

#include <sac/lab/peak.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/profiler/orchestration/observer.h>
#include <c10/util/SmallVector.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace sac::detail {

inline constexpr size_t kNever = static_cast<size_t>(-1);

struct Allocation {
  int64_t bytes = 0;
  size_t made = 0;        // its event
  size_t freed = kNever;  // its free's event; kNever if alive at the step's end
};

struct TraceEvent {
  // The allocation it makes (delta > 0) or frees (delta < 0); a free of a
  // block made before the step has none (kNever).
  size_t allocation = kNever;
  int64_t delta = 0;
};

// An op call seen on the step's thread in a region's forward or
// recomputation.
struct TracedCall {
  size_t begin = 0;  // position: the events before the call
  size_t end = 0;    // and once it returned
  // Per defined output tensor (in detail::for_each_tensor's order), the
  // allocation its storage is, or kNever (made before the step, or empty).
  c10::SmallVector<size_t, 2> outputs;
  bool random = false;
};

// An input the region's frame held for its recomputation (Note [A region
// left unchecked] in plan_trace.cpp): where the frame's hold freed it, and where
// it would have been freed without the frame (once nothing else held it).
struct HeldInput {
  size_t freed = kNever;           // its free's event
  size_t dropped = kNever;         // position: the rest of the program let go of it
  bool saved = false;              // the region's forward saved it for backward
  size_t saves_released = kNever;  // position: autograd let go of those saves
};

// A tensor the region's forward saved for backward (packed by its frame).
struct TracedSave {
  size_t allocation = kNever;  // its storage, or kNever (made before the step)
  size_t released = kNever;    // position: autograd let go of it
};

struct TracedRegion {
  size_t forward_begin = 0, forward_end = kNever;
  size_t recompute_begin = kNever, recompute_end = kNever;
  size_t released = kNever;  // its frame let go of its contexts' state
  std::vector<HeldInput> inputs;
  std::vector<TracedSave> saves;
  // Its frame reported its inputs and saves (sac::checkpoint's does; a
  // region of PyTorch's checkpoint, or a sac::CheckpointRegion, does not):
  // a plan may leave it unchecked.
  bool heard_whole = false;
  // Per op, its calls in order: call `i` is the op's `i`th in the region
  // (what a policy's answers are keyed by).
  std::unordered_map<c10::OperatorHandle, std::vector<TracedCall>> forward, recompute;
};

struct StepTrace {
  std::vector<TraceEvent> events;
  std::vector<Allocation> allocations;
  std::vector<TracedRegion> regions;  // in the order their forwards began
  std::vector<StepPhase> phases;
  // Bytes of a CPU generator's state: what serving a kept random call
  // allocates for a moment to restore the generator (on the CPU).
  int64_t rng_state_bytes = 0;
  bool on_cpu = true;

  // Live bytes after each event, over the step's start.
  std::vector<int64_t> live() const;
};

// Sits in the thread's profiler slot as a disabled profiler (Note [The
// step's memory shares the profiler's slot], step_trace.cpp) and hears
// c10's memory reports of `device`'s allocator, from any thread.
class MemoryListener : public torch::profiler::impl::ProfilerStateBase {
 public:
  explicit MemoryListener(c10::Device device);
  torch::profiler::impl::ActiveProfilerType profilerType() override;
  bool memoryProfilingEnabled() const override { return true; }
  void reportMemoryUsage(void* ptr, int64_t bytes, size_t total_allocated, size_t total_reserved,
                         c10::Device device) final;

 protected:
  // An allocation (bytes > 0) or a free (bytes < 0) of the device's.
  virtual void heard(void* ptr, int64_t bytes) = 0;

  const c10::Device device_;
};

// Runs `step` with `listener` in the thread's profiler slot, where c10
// reports the step's allocations (Note [The step's memory shares the
// profiler's slot], step_trace.cpp): an error, naming `api`, if a profiler
// holds the slot or takes it during the step.
void hear_memory(const std::shared_ptr<c10::DebugInfoBase>& listener, const char* api,
                 const std::function<void()>& step);

// An error, naming `api`, where `device` is the CPU and ops run on several
// intra-op threads, whose scratch allocations c10 does not report.
void check_one_thread(const c10::Device& device, const char* api);

// Runs `step` and traces it; the probe's own peak, if it has one, must agree
// with the traced events (else the allocator does not report them all: an
// error). Without a probe (CPU only), the reports are the measurement.
StepTrace trace_step(const MemoryProbe& probe, const std::function<void()>& step);

}  // namespace sac::detail
