// Note [The knapsack]
//
// The 0/1 knapsack behind budgeted policies: keep the op calls whose
// recomputation costs the most time, within a byte budget.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace sac::detail {

struct Item {
  int64_t weight = 0;  // bytes saved if chosen (>= 0)
  double value = 0;    // time spared if chosen (>= 0)
  // Items of one group (>= 0) exclude their group's `whole` item: either it
  // is chosen or any of the others (a region not checkpointed, or some of
  // its calls kept).
  int group = -1;
  bool whole = false;
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
// `capacity`, with at most one whole item per group and none of its group's
// other items beside it. Exact by branch and bound on the Dantzig
// (fractional) bound, unless more than `max_nodes` nodes are needed: the
// whole items are decided first, then the others in order of value per byte,
// with dominated branches cut (an item taken after an earlier one of the
// same weight and no less value was left out while it could be taken). The
// bound ignores the groups, which only loosens it, and deciding the whole
// items costs up to 2^wholes branches: with more than kExactWholes of them
// the whole items are chosen by local search instead (from none, add the one
// that improves the exact choice of the others most, while one does), and
// the choice is not `exact`. Either way no group's other items are chosen
// where its whole item would weigh no more and be worth no less.
constexpr size_t kExactWholes = 12;
Choice solve_knapsack(const std::vector<Item>& items, int64_t capacity,
                      size_t max_nodes = 10'000'000);

}  // namespace sac::detail
