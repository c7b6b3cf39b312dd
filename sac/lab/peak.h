// sac::measure_step_phases: a training step's memory, allocation by
// allocation, and the peak it would reach under any plan, predicted.
//
//   // One step with every region recomputing everything (nothing kept),
//   // on the CPU (elsewhere, give sac::device_memory_probe(device) first):
//   sac::StepPhases phases = sac::measure_step_phases([&] { step(); });
//   auto plan = sac::budgeted_plan(profiles, sac::Budget::fraction(0.3));
//   int64_t predicted = phases.predict_peak(plan);   // the step's peak under it
//   sac::PeakPlan fits = phases.plan_for_peak(profiles, limit);
//
// The step is traced: the list of its allocations and frees, in order,
// from c10's memory reporting (what PyTorch's memory profiler hears; the
// CPU's default allocator, the counting allocator of the tests and CUDA's
// caching allocator report), with
// each region's forward and recomputation and their op calls placed in it.
// A plan changes that list in three ways only (Note [A plan's trace] in
// plan_trace.cpp): a kept output's storage lives on until the recomputation takes
// it, the taken call allocates nothing in the recomputation, and its place
// there is held by the kept storage for as long as the recomputed one was.
// So the prediction is the peak of the changed list: on the CPU it equals
// the counting allocator's peak to the byte (tests/fuzz/peak_models.cpp
// checks it on generated models, tests/lab_peak_model_test.cpp on the shapes
// that broke the first model).
//
// Leaving a region unchecked is a plan too, predicted from the same trace
// (Note [A region left unchecked] in plan_trace.cpp): the step heard what each
// region's forward saved and when autograd let go of it, and when the rest
// of the program let go of each region's inputs. So not checkpointing at
// all is predicted (plain_peak()), the step is never run without
// checkpointing, and a peak budget the plain step fits is met by the plan
// that recomputes nothing.
//
// What the model does not cover is refused, not guessed: a measured step
// that keeps outputs, nested regions, a recomputation inside a forward, a
// region recomputed twice, an allocator whose reports miss bytes the probe
// counts, a CPU step on several intra-op threads (their scratch buffers are
// not reported to the step's thread), and a plan that keeps a call whose
// output lies on the storage of a call it recomputes. On an accelerator the
// events are the caching allocator's blocks (allocated bytes, rounded as it
// rounds them; not the cached, reserved bytes: sac_peak_models --blocks 512
// checks the model on CPU blocks rounded alike); a recomputation that
// autograd runs on a device thread is not observed, so its calls are not
// found there (no accelerator has run this).
#pragma once

#include <sac/lab/budget.h>
#include <sac/lab/memory.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace sac {

// A stretch of the measured step's trace: a region's forward, the code between
// regions, or a region's backward (from its recomputation's start to the
// next region event).
struct StepPhase {
  enum class Kind { Between, Forward, Backward };
  Kind kind = Kind::Between;
  int region = -1;
  int64_t peak = 0;  // measured: bytes over what was live when the step began
  size_t begin = 0;  // its first event
  size_t end = 0;    // one past its last
};

// A plan for a peak budget (StepPhases::plan_for_peak).
struct PeakPlan {
  // Its budget_bytes: the byte budget it was solved at. Where the plain
  // step fits, the plan leaves every region unchecked (plan.checkpointed
  // all false, budget_bytes 0) and recomputes nothing.
  BudgetedPlan plan;
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

namespace detail {
struct StepTrace;
}

class StepPhases {
 public:
  explicit StepPhases(std::shared_ptr<const detail::StepTrace> trace);

  // The step's phases, in order.
  const std::vector<StepPhase>& phases() const;
  int regions() const;
  // Allocations and frees traced.
  size_t events() const;
  // The measured step's peak, over what was live when it began.
  int64_t peak() const;
  // The peak of the step with every region plain (not checkpointed), over
  // what was live when it began: predicted (Note [A region left unchecked]
  // in plan_trace.cpp), or the one with_plain_peak gave. std::nullopt where a
  // region's frame did not tell the step what it saves and holds (PyTorch's
  // checkpoint, sac::CheckpointRegion) and none was given; why_no_plain_peak
  // says why.
  std::optional<int64_t> plain_peak() const;
  const std::string& why_no_plain_peak() const;
  // The same step with another plain peak (or none, and why): on ranks, the
  // most any rank has, so that every rank plans alike; for regions of
  // PyTorch's checkpoint, the plain step's measured peak.
  StepPhases with_plain_peak(std::optional<int64_t> plain_peak, std::string why_not = "") const;
  // Bytes the step left live over what was live when it began (gradients it
  // made, an optimizer's state).
  int64_t left() const;
  // The step's peak under `plan`, whose policies are the regions', in the
  // order their forwards began; regions it leaves unchecked included.
  int64_t predict_peak(const BudgetedPlan& plan) const;
  // The same from the calls each region keeps, in order: a budgeted plan's
  // or any policy's (Explanation::saved_calls, sac/lab/explain.h, which
  // includes the calls kept and dropped at the forward's end).
  int64_t predict_peak(const std::vector<std::vector<SavedCall>>& saved_calls) const;
  // The plan of least recomputation time whose predicted peak is at most
  // `peak_bytes`, for the regions profiled in `profiles` (one per region,
  // in order). Where plain_peak() fits, the plan that checkpoints nothing.
  // Else searched among budgeted plans (sac/lab/budget.h) at byte
  // budgets from none to everything: a grid of `grid` budgets, then halving
  // between the greatest that fits and the next. The grid does not depend on
  // the peak budget, so more peak budget never gives a plan that recomputes
  // more. Bounded by the exact knapsack of what each choice adds where the
  // plan peaks and where every region's outputs are kept, against the
  // headroom there (any plan that fits fits these). An error if even full
  // recomputation's peak is over the budget.
  //
  // With `offload`, an accelerator's outputs may be offloaded where the trip
  // costs less than their recomputation (the cost is then recomputation and
  // trips). The prediction counts an offloaded output nowhere on the device:
  // its copy back is not modelled (no accelerator has run it).
  PeakPlan plan_for_peak(const std::vector<RegionProfile>& profiles, int64_t peak_bytes,
                         std::optional<OffloadCost> offload = std::nullopt, size_t grid = 32) const;

  // A table, one row per phase (with the prediction for `plan` if given).
  void print(std::ostream& out, const BudgetedPlan* plan = nullptr) const;

 private:
  std::shared_ptr<const detail::StepTrace> trace_;
  std::vector<int64_t> live_;  // after each event
  std::vector<StepPhase> phases_;
  // Predicted at construction where every region was heard whole, or given
  // by with_plain_peak.
  std::optional<int64_t> plain_peak_;
  std::string why_no_plain_peak_;
};

// Runs `step` once and traces it. Every region in it must keep nothing (no
// policy, or nothing_saveable()): the prediction changes this step's trace by what a
// plan keeps. An error otherwise, for a step that ran no region, and for
// what the model does not cover (see above). The step may do anything a
// training step does around its regions: zero or keep the gradients, make
// or update an optimizer's state. The probe's peak checks that the
// allocator reported every byte.
StepPhases measure_step_phases(const MemoryProbe& probe, const std::function<void()>& step);

// The same on the CPU with no probe: the reports are the measurement
// (sac/lab/memory.h), so the CPU's default allocator needs nothing
// installed.
StepPhases measure_step_phases(const std::function<void()>& step);

}  // namespace sac
