// A plan's changes to the measured step's trace (sac/lab/internal/step_trace.h),
// and the step's bytes under them: what sac/lab/peak.h predicts a plan's
// peak with. See Note [A plan's trace] and Note [A region left unchecked]
// in sac/lab/plan_trace.cpp.
#pragma once

#include <sac/lab/budget.h>
#include <sac/lab/internal/step_trace.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace sac::detail {

// A plan's changes to the measured trace's events.
struct Changes {
  std::vector<size_t> removed;                      // events that do not happen
  std::vector<std::pair<size_t, int64_t>> frees;    // bytes freed before an event
  std::vector<std::pair<size_t, int64_t>> moments;  // bytes allocated for a moment there
};

// An error unless the plan has one policy per region the step ran.
void check_one_policy_per_region(const StepTrace& trace, size_t policies);

// The changes of the plan that keeps `kept` (per region, its saved calls).
// `checkpointed`, if given, leaves the regions it marks false unchecked.
Changes changes_of(const StepTrace& trace, const std::vector<std::vector<SavedCall>>& kept,
                   const std::vector<bool>& checkpointed = {});

// The step's bytes under `changes`: at each event, the most live at once
// (after it, or for a moment before it); and the peak's event.
struct Simulated {
  std::vector<int64_t> peak_at;
  int64_t peak = 0;
  size_t at = 0;
};

Simulated simulate(const StepTrace& trace, const Changes& changes);

// What `changes` add to the bytes live after event `at` (negative where they
// free or skip).
int64_t added_at(const StepTrace& trace, const Changes& changes, size_t at);

}  // namespace sac::detail
