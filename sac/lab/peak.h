// sac::measure_step_phases: a training step's memory, phase by phase, and
// the peak it would reach under a budgeted plan, predicted.
//
//   sac::MemoryProbe probe{live, peak, reset_peak};  // the caller's allocator
//   // One step with every region recomputing everything (nothing kept):
//   sac::StepPhases phases = sac::measure_step_phases(probe, [&] { step(); });
//   auto plan = sac::budgeted_plan(profiles, sac::Budget::fraction(0.3));
//   int64_t predicted = phases.predict_peak(plan);
//
// The regions' frames mark the step's phases (sac/base/internal/region_events.h):
// each region's forward, the stretches between, and each region's backward,
// from its recomputation's start to the next mark. Within them, every op call
// seen on the thread divides a phase further (all ops under the fallback key,
// the cacheable ones under per-op kernels). The peak of each stretch is
// measured with the probe, in bytes over what was live when the step began,
// and the storages made by the op calls of each region's forward are
// watched: at which stretch each was freed.
//
// A plan changes the step by the outputs its regions keep. A kept output
// lives from its call until its region's recomputation takes it (or, past
// where the recomputation stops, until it ends). Where the measured step kept
// its storage alive anyway (a region's output, read by the next region), it
// adds nothing; in its region's own backward it takes the place of what full
// recomputation makes again. The prediction is, over the stretches, the
// stretch's measured peak plus the bytes of the kept storages (of regions
// alive through the phase, and of the region whose forward it is) that the
// measured step had freed: by the start of a gap between op calls (where
// memory is only freed, so its peak is at its start), by the end of a call's
// stretch (an upper bound for a storage freed inside a call). On the CPU,
// with the counting allocator, the tests find it exact.
//
// The probe sees the thread that runs the step: a recomputation that
// autograd runs on a device thread (CUDA) marks no phase.
#pragma once

#include <sac/lab/budget.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <vector>

namespace sac {

// Live bytes and the peak since the last reset, of the allocator the step
// uses: the counting allocator on CPU (examples/memory_meter.h), the caching
// allocator's statistics on an accelerator (device_memory_probe).
struct MemoryProbe {
  std::function<int64_t()> live;
  std::function<int64_t()> peak;
  std::function<void()> reset_peak;
  // Bytes the allocator could still hand out, if it knows: a peak budget
  // read at solve time is free() less a margin (sac/lab/shape_plans.h).
  std::function<int64_t()> free;
};

// The probe of `device`'s caching allocator (CUDA's, or any registered
// c10::DeviceAllocator): live and peak are its allocated bytes; free is the
// device's free memory plus what the allocator has reserved and not handed
// out. A clear error for the CPU or a device type without such an allocator.
MemoryProbe device_memory_probe(c10::Device device);

// A moment of the measured step: the end of stretch `step` of phase
// `phase` (see StepPhase::step_peaks).
struct StepPoint {
  size_t phase = 0;
  size_t step = 0;
  bool operator<(const StepPoint& o) const {
    return phase < o.phase || (phase == o.phase && step < o.step);
  }
};

// An op call in a region's forward: call `call` of `op` in region `region`
// (regions numbered in the order their forwards began), as a policy of that
// region is asked about it; the stretch it ran in, and each new storage its
// outputs made: its bytes and the first moment it was found freed (never:
// phase past the last).
struct StepCall {
  struct Storage {
    int64_t bytes = 0;
    StepPoint freed{static_cast<size_t>(-1), 0};
  };
  int region = 0;
  c10::OperatorHandle op;
  size_t call = 0;
  StepPoint made;
  std::vector<Storage> storages;
};

struct StepPhase {
  enum class Kind {
    Between,   // outside every region's forward and backward
    Forward,   // in `region`'s forward
    Backward,  // from `region`'s recomputation's start to the next mark
  };
  Kind kind = Kind::Between;
  int region = -1;
  // Bytes over what was live when the step began: the peak of each stretch
  // of the phase, alternately the gap before an op call seen on the thread
  // and the call itself (the last gap ends with the phase).
  std::vector<int64_t> step_peaks;
  // Per stretch: a gap between op calls (true) or an op call's own.
  std::vector<bool> step_is_gap;
  // The regions whose kept outputs would be alive through the phase: their
  // forward ended and their recomputation has not begun.
  std::vector<int> alive;

  // The phase's peak: its stretches' highest.
  int64_t peak() const;
};

// A plan for a peak budget (StepPhases::plan_for_peak).
struct PeakPlan {
  BudgetedPlan plan;  // its budget_bytes: the byte budget it was solved at
  int64_t peak_budget = 0;
  int64_t predicted_peak = 0;
  // Whether no plan whose predicted peak fits costs less (recomputation,
  // and offload trips): proven when the plan reaches the bound, else at
  // most `gap_seconds` more.
  bool exact = false;
  double gap_seconds = 0;
  size_t byte_budgets_tried = 0;
  double solver_seconds = 0;
};

class StepPhases {
 public:
  StepPhases(std::vector<StepPhase> phases, std::vector<StepCall> calls, int regions)
      : phases_(std::move(phases)), calls_(std::move(calls)), regions_(regions) {}

  const std::vector<StepPhase>& phases() const { return phases_; }
  const std::vector<StepCall>& calls() const { return calls_; }
  int regions() const { return regions_; }
  // The measured step's peak.
  int64_t peak() const;
  // The step's peak under `plan`, whose policies are the regions', in the
  // order their forwards began.
  int64_t predict_peak(const BudgetedPlan& plan) const { return predict_peak(plan.kept_calls); }
  // The same from the calls each region keeps, in order: a budgeted plan's
  // or any policy's (Explanation::kept_calls, sac/lab/explain.h).
  int64_t predict_peak(const std::vector<std::vector<KeptCall>>& kept_calls) const;
  // The plan of least recomputation time whose predicted peak is at most
  // `peak_bytes`, for the regions profiled in `profiles` (one per region,
  // in order). Searched among budgeted plans (sac/lab/budget.h) at byte
  // budgets from none to everything: a grid, then halving between the best
  // that fits and the next that does not. Bounded by the exact knapsack of
  // the choices' bytes at the stretches where the plan peaks and where every
  // region's outputs are kept, each against that stretch's headroom (any
  // plan that fits the budget fits these). More peak budget never gives a
  // plan that recomputes more. An error if even full recomputation's peak
  // is over the budget.
  //
  // With `offload`, an accelerator's outputs may be offloaded where the trip
  // costs less than their recomputation (the cost is then recomputation and
  // trips): an offloaded output adds nothing on the device until its
  // region's backward brings it back, in place of what full recomputation
  // makes there. On the CPU there are no such outputs.
  PeakPlan plan_for_peak(const std::vector<RegionProfile>& profiles, int64_t peak_bytes,
                         std::optional<OffloadCost> offload = std::nullopt,
                         size_t grid = 32) const;

  // A table, one row per phase (with the prediction for `plan` if given).
  void print(std::ostream& out, const BudgetedPlan* plan = nullptr) const;

 private:
  std::vector<int64_t> predicted_phases(const std::vector<std::vector<KeptCall>>& kept_calls) const;
  size_t find_call(int region, const c10::OperatorHandle& op, size_t call) const;
  // Whether `region`'s kept outputs count in `phase`.
  static bool counts(const StepPhase& phase, int region);
  // Bytes that keeping step call `call` (`plan_bytes` by the plan) adds at
  // stretch `step` of phase `phase`, where its region counts.
  int64_t adds_at(size_t call, int64_t plan_bytes, size_t phase, size_t step) const;

  std::vector<StepPhase> phases_;
  std::vector<StepCall> calls_;
  int regions_;
};

// Runs `step` once and measures its phases. Every region in it must keep
// nothing (no policy, or nothing_saveable()): the prediction adds what a
// plan keeps to these measurements.
StepPhases measure_step_phases(const MemoryProbe& probe, const std::function<void()>& step);

}  // namespace sac
