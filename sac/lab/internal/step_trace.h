// A training step's allocations, event by event, placed among its regions'
// op calls: what sac/lab/peak.h predicts a plan's peak from.
//
// Traced with c10's memory reporting (c10::reportMemoryUsageToProfiler,
// what PyTorch's memory profiler listens to): every allocation and free of
// an allocator that reports, in the order they happen. The op calls of each
// region's forward and recomputation are placed between them (positions:
// the number of events before), with the allocations their outputs' storages
// are, so that a plan's changes to the step are changes to this list: see
// Note [A plan's trace] in peak.cpp.
#pragma once

#include <sac/lab/peak.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/SmallVector.h>

#include <cstddef>
#include <cstdint>
#include <functional>
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

struct TracedRegion {
  size_t forward_begin = 0, forward_end = kNever;
  size_t recompute_begin = kNever, recompute_end = kNever;
  size_t released = kNever;  // its frame let go of its contexts' state
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

// Runs `step` and traces it; the probe's own peak must agree with the
// traced events (else the allocator does not report them all: an error).
StepTrace trace_step(const MemoryProbe& probe, const std::function<void()>& step);

}  // namespace sac::detail
