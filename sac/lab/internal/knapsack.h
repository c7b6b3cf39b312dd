// Note [The knapsack]
//
// The 0/1 knapsack behind budgeted policies: keep the op calls whose
// recomputation costs the most time, within a byte budget.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace sac::lab {

struct Item {
  int64_t weight = 0;  // bytes kept if chosen (>= 0)
  double value = 0;    // time saved if chosen (>= 0)
};

struct Choice {
  std::vector<size_t> chosen;  // indices into the items, ascending
  int64_t weight = 0;
  double value = 0;
  // Whether `value` is proven optimal. Branch and bound stops after
  // `max_nodes`; the best choice found is then returned, with
  // `upper_bound` (the LP relaxation's at the root) on the optimum. The
  // choice is never worse than the greedy one, whose value is at least
  // half the optimum.
  bool exact = true;
  double upper_bound = 0;
};

// The items of greatest total value whose total weight is at most
// `capacity`. Exact by branch and bound on the Dantzig (fractional) bound,
// with dominated branches cut (an item taken after an earlier one of the same
// weight and no less value was left out), unless more than `max_nodes` nodes
// are needed.
Choice solve_knapsack(const std::vector<Item>& items, int64_t capacity,
                      size_t max_nodes = 10'000'000);

}  // namespace sac::lab
