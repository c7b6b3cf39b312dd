// The search behind StepPhases::plan_for_peak (sac/lab/peak.h): the cheapest
// budgeted plan whose predicted peak fits, and a bound on what any plan that
// fits can cost. See Note [Planning for a peak] in sac/lab/peak_search.cpp.
#pragma once

#include <sac/lab/budget.h>
#include <sac/lab/internal/step_trace.h>
#include <sac/lab/peak.h>
#include <sac/lab/profile.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace sac::detail {

// What a plan costs a step: its recomputation and its offloads' trips.
inline double plan_cost(const BudgetedPlan& plan) {
  return plan.recompute_seconds + plan.offload_seconds;
}

// The cheapest plan whose predicted peak is at most `peak_bytes`, searched
// over byte budgets (`grid` of them, then halving); full recomputation must fit.
PeakPlan cheapest_plan_that_fits(const StepPhases& step, const std::vector<RegionProfile>& profiles,
                                 int64_t peak_bytes, std::optional<OffloadCost> offload,
                                 size_t grid);

// The least any plan that fits `peak_bytes` can cost, a bound (`best`: the
// plan found, where the bound is asked first).
double least_cost_that_fits(const StepTrace& trace, const std::vector<int64_t>& live,
                            const std::vector<RegionProfile>& profiles, int64_t peak_bytes,
                            std::optional<OffloadCost> offload, const BudgetedPlan& best);

}  // namespace sac::detail
