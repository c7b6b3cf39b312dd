// Budgeted policies: from profiles, keep the op calls that save the most
// recomputation time within a memory budget, exactly.
//
//   auto p = sac::profile([&] { block->forward(x); });
//   auto policy = sac::budgeted_policy(p, sac::Budget::fraction(0.3));
//   auto y = sac::checkpoint(sac::CheckpointOptions().policy(policy), fn, x);
//
// The choice is a 0/1 knapsack over the profile's keepable calls (bytes kept
// against time recomputed), solved exactly (sac/lab/knapsack.h). The policy
// answers MustSave for the chosen calls by (op, call index) and
// PreferRecompute otherwise, so it replays a region that runs the same ops
// as the profiled one: the bytes it keeps after the forward are the chosen
// calls' bytes, which never exceed the budget.
#pragma once

#include <sac/lab/knapsack.h>
#include <sac/lab/profile.h>
#include <sac/policy/policy.h>

#include <cstdint>
#include <vector>

namespace sac {

// A byte budget, absolute or as a fraction of what saving every cacheable
// call keeps.
class Budget {
 public:
  static Budget bytes(int64_t bytes);
  // `fraction` in [0, 1] of the profiles' keepable bytes (what
  // everything_saveable() keeps).
  static Budget fraction(double fraction);

  // The budget in bytes for regions that keep `everything` when every
  // keepable call is saved.
  int64_t resolve(int64_t everything) const;

 private:
  Budget(int64_t bytes, double fraction) : bytes_(bytes), fraction_(fraction) {}
  int64_t bytes_;
  double fraction_;  // used when bytes_ < 0
};

struct BudgetedPlan {
  // One policy per profile, in order.
  std::vector<Policy> policies;
  int64_t budget_bytes = 0;
  // Predicted: bytes kept after the forward, and the time of the calls the
  // recomputation runs (all profiled calls but the kept ones).
  int64_t kept_bytes = 0;
  double recompute_seconds = 0;
  lab::Choice choice;       // over all profiles' keepable calls
  double solver_seconds = 0;
};

// One budget shared by several regions (a model's blocks): the calls are
// chosen across all of them at once.
BudgetedPlan budgeted_plan(const std::vector<RegionProfile>& profiles, Budget budget);

// The policy of one region.
Policy budgeted_policy(const RegionProfile& profile, Budget budget);

}  // namespace sac
