// The choices of a budgeted plan (sac/lab/budget.h, sac/lab/peak.h): the
// keepable calls of a profile, grouped by the storage they share.
#pragma once

#include <sac/lab/budget.h>
#include <sac/lab/profile.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace sac::detail {

// What leaving a call off its device costs: its recomputation, or its trip
// to host memory and back if that is cheaper.
struct LeftOut {
  double seconds;
  bool offloaded;
};

LeftOut left_out(const OpCallProfile& call, const std::optional<OffloadCost>& offload);

// One choice of the knapsack: the keepable calls of a profile whose outputs
// share storage (a matmul's result and the aten::_unsafe_view of it).
// Saving any of them keeps all of that storage, so they are saved together
// or not at all: `bytes` are the storages' (their makers' output_bytes,
// kept or not), `left` what leaving them all out costs.
struct CallChoice {
  size_t profile = 0;
  std::vector<const OpCallProfile*> calls;
  int64_t bytes = 0;
  LeftOut left{0, false};
};

// The choices of `profile`, the `index`th of a plan's.
std::vector<CallChoice> choices_of(const RegionProfile& profile, size_t index,
                                   const std::optional<OffloadCost>& offload);

// The plan that checkpoints none of the regions: the plain step. Its
// saved_bytes are the regions' plain_bytes (-1 if a profile did not measure
// them); it recomputes nothing.
BudgetedPlan plan_unchecked(const std::vector<RegionProfile>& profiles);
// The plan that checkpoints every region and keeps nothing: the measured
// step itself. (A byte budget of 0 may still keep calls of no bytes, those
// whose outputs the region returns, which can raise the step's peak.)
BudgetedPlan plan_keeping_nothing(const std::vector<RegionProfile>& profiles);

}  // namespace sac::detail
