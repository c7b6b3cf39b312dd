#include <sac/lab/internal/peak_search.h>

#include <sac/lab/internal/choices.h>
#include <sac/lab/internal/knapsack.h>
#include <sac/lab/internal/plan_trace.h>

#include <algorithm>

namespace sac::detail {

// Note [Planning for a peak]
// A plan is the budgeted plan of some byte budget (sac/lab/budget.h): the
// search tries byte budgets, predicts each plan's peak from the step's
// trace, and keeps the cheapest plan whose peak fits. Then a bound on what
// any plan that fits can cost says how far from the best that one may be
// (PeakPlan::gap_seconds).

// The search: `grid` byte budgets evenly from none to everything keepable,
// then halving between the greatest that fits and the next. The grid is the
// same for every peak budget, and the halving runs between its greatest
// budget that fits and the next: a greater peak budget fits the same grid
// budgets and more, and where it halves the same interval it moves up
// wherever this one does, so (the knapsack's cost falling with its budget)
// it never recomputes more.
PeakPlan cheapest_plan_that_fits(const StepPhases& step, const std::vector<RegionProfile>& profiles,
                                 int64_t peak_bytes, std::optional<OffloadCost> offload,
                                 size_t grid) {
  const int64_t everything =
      budgeted_plan(profiles, Budget::of_everything_saveable(1.0), std::nullopt, false)
          .budget_bytes;
  PeakPlan best;
  best.peak_budget = peak_bytes;
  size_t tried = 0;
  // Tries the plan at `bytes`: whether its predicted peak fits; keeps it if
  // it costs least so far.
  auto fits = [&](int64_t bytes) {
    ++tried;
    BudgetedPlan plan = budgeted_plan(profiles, Budget::bytes(bytes), offload, false);
    const int64_t predicted = step.predict_peak(plan);
    if (predicted > peak_bytes) {
      return false;
    }
    if (plan_cost(plan) < plan_cost(best.plan)) {
      best.plan = std::move(plan);
      best.predicted_peak = predicted;
    }
    return true;
  };
  auto grid_bytes = [&](size_t i) {
    return static_cast<int64_t>(static_cast<double>(everything) * static_cast<double>(i) /
                                static_cast<double>(grid - 1));
  };
  // Full recomputation fits (the caller checked).
  best.plan = detail::plan_keeping_nothing(profiles);
  best.predicted_peak = step.peak();
  ++tried;
  size_t greatest = 0;
  for (size_t i = 1; i < grid; ++i) {
    if (fits(grid_bytes(i))) {
      greatest = i;
    }
  }
  if (greatest + 1 < grid) {
    int64_t lo = grid_bytes(greatest);
    int64_t hi = grid_bytes(greatest + 1);
    while (hi - lo > std::max<int64_t>(1, everything / 4096)) {
      const int64_t mid = lo + (hi - lo) / 2;
      (fits(mid) ? lo : hi) = mid;
    }
  }
  best.byte_budgets_tried = tried;
  return best;
}

// The bound: after an event, any plan that fits keeps choices whose bytes
// there sum to at most the headroom; the best such (exact knapsack, with
// the choices that free bytes there taken) saves at least as much as any
// plan that fits. Asked at the events where `best` peaks and where keeping
// everything does. Returns the least any plan that fits can cost: every
// profiled call's time, with each choice left out the cheaper way, less the
// bound on what keeping saves over that.
double least_cost_that_fits(const StepTrace& trace, const std::vector<int64_t>& live,
                            const std::vector<RegionProfile>& profiles, int64_t peak_bytes,
                            std::optional<OffloadCost> offload, const BudgetedPlan& best) {
  std::vector<detail::CallChoice> choices;
  for (size_t r = 0; r < profiles.size(); ++r) {
    for (auto& c : detail::choices_of(profiles[r], r, offload)) {
      choices.push_back(std::move(c));
    }
  }
  std::vector<Changes> changes;
  double everything_seconds = 0;
  for (const auto& choice : choices) {
    std::vector<std::vector<SavedCall>> alone(profiles.size());
    for (const OpCallProfile* call : choice.calls) {
      alone[choice.profile].push_back({call->op, call->call, 0});
    }
    changes.push_back(changes_of(trace, alone));
    everything_seconds += choice.left.seconds;
  }
  auto bound_at = [&](size_t event) {
    std::vector<detail::Item> items;
    int64_t capacity = peak_bytes - live[event];
    double taken = 0;
    for (size_t i = 0; i < choices.size(); ++i) {
      const int64_t weight = added_at(trace, changes[i], event);
      if (weight <= 0) {
        capacity -= weight;
        taken += choices[i].left.seconds;
      } else {
        items.push_back({weight, choices[i].left.seconds});
      }
    }
    if (capacity < 0) {
      return 0.0;
    }
    const detail::Choice relaxed = detail::solve_knapsack(items, capacity);
    return taken + (relaxed.exact ? relaxed.value : relaxed.upper_bound);
  };
  double bound = everything_seconds;
  if (!live.empty()) {
    bound = std::min(bound, bound_at(simulate(trace, changes_of(trace, best.saved_calls)).at));
    const BudgetedPlan all =
        budgeted_plan(profiles, Budget::of_everything_saveable(1.0), offload, false);
    bound = std::min(bound, bound_at(simulate(trace, changes_of(trace, all.saved_calls)).at));
  }
  double least = -bound;
  for (const auto& profile : profiles) {
    for (const auto& call : profile.calls()) {
      least += call.recompute_seconds();
    }
  }
  for (const auto& choice : choices) {
    least += choice.left.seconds;
    for (const OpCallProfile* call : choice.calls) {
      least -= call->recompute_seconds();
    }
  }
  return least;
}

}  // namespace sac::detail
