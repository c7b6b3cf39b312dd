// Budgeted policies: from profiles, keep the op calls that spare the most
// recomputation time within a memory budget, exactly.
//
//   auto p = sac::profile([&] { return block->forward(x); });
//   auto policy = sac::budgeted_policy(p, sac::Budget::fraction(0.3));
//   auto y = sac::checkpoint(sac::CheckpointOptions().policy(policy), fn, x);
//
// The choice is a 0/1 knapsack over the profile's keepable calls (bytes saved
// against time recomputed), solved exactly (Note [The knapsack]). The policy
// answers MustSave for the chosen calls by (op, call index) and
// PreferRecompute otherwise, so it fits a region that runs the same ops
// as the profiled one: the bytes it saves after the forward are the chosen
// calls' bytes, which never exceed the budget.
//
// Not checkpointing can be a choice too, per region (`unchecked_regions`):
// the region keeps what autograd saves in it (RegionProfile::plain_bytes)
// and recomputes nothing. Keeping every call keeps more than that (outputs
// autograd never saves: 1.3 to 1.7 times as much on small Hugging Face models),
// so without the choice a plan may keep a region's calls worth more bytes
// than not checkpointing it, and still recompute; with it, the solver takes
// the region unchecked instead, and the plan is never worse than not
// checkpointing. Such a region's policy says so (Policy::checkpoints() is
// false): sac::checkpoint and sac::CheckpointRegion run it plainly, as
// Python's sac.context_fn does under PyTorch's checkpoint, and
// create_selective_checkpoint_contexts refuses it. It is a choice by
// default; pass false where the regions checkpoint whatever the plan says
// (a checkpoint of one's own under sac's contexts).
// StepPhases::predict_peak predicts such a plan from the measured step where
// each unchecked region's frame told it what the region saves and holds
// (Note [A region left unchecked] in sac/lab/plan_trace.cpp).
//
// Offload is a third choice where outputs live on an accelerator: a call
// left off the device costs the less of its recomputation and its bytes'
// trip to host memory and back (at a measured bandwidth), so keeping it
// spares that much. The knapsack stays 0/1 and exact; the calls it leaves
// out that are cheaper to move than to recompute are answered
// MustCpuOffload (moved to host_memory(), sac/base/copy_target.h).
#pragma once

#include <sac/lab/profile.h>
#include <sac/policy/policy.h>

#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace sac {

// A byte budget: absolute, or a fraction of what the regions keep not
// checkpointed. A fraction is always of not checkpointing, here as in a
// peak (sac.fit's peak=0.6); a budget of what everything_saveable() keeps
// has its own name.
class Budget {
 public:
  static Budget bytes(int64_t bytes);
  // `fraction` in [0, 1] of what the regions keep unchecked (the sum of
  // their profiles' plain_bytes): the step without checkpointing keeps 1.0,
  // and a plan at 1.0 leaves every region unchecked where it may. Every
  // profile must have measured its plain bytes (sac::profile of a region
  // that returns its outputs does).
  static Budget fraction(double fraction);
  // `fraction` in [0, 1] of the profiles' keepable bytes (what
  // everything_saveable() keeps, 1.3 to 1.7 times the plain bytes on small
  // Hugging Face models), for experiments on the calls alone.
  static Budget of_everything_saveable(double fraction);

  // The budget in bytes for regions that keep `plain` unchecked (-1: not
  // measured) and `everything` when every keepable call is saved.
  int64_t resolve(int64_t plain, int64_t everything) const;

 private:
  enum class Of { Bytes, Plain, Everything };
  Budget(Of of, int64_t bytes, double fraction) : of_(of), bytes_(bytes), fraction_(fraction) {}
  Of of_;
  int64_t bytes_;
  double fraction_;
};

// Offload as a choice, for calls whose outputs are on an accelerator: moving
// `bytes` out and back takes bytes / bytes_per_second.
struct OffloadCost {
  double bytes_per_second = 0;
};

// The bandwidth of a round trip of `bytes` between `device` (an accelerator)
// and pinned host memory: the best of a few synchronous copies out and back.
double measure_offload_bandwidth(c10::Device device, int64_t bytes = int64_t{64} << 20);

// A call a region's policy saves: call `call` of `op`, and the bytes saving
// it holds on the device (calls that share a storage count it once, at one
// of them): what sac::StepPhases::predict_peak (sac/lab/peak.h) adds to a
// step.
struct SavedCall {
  c10::OperatorHandle op;
  size_t call = 0;
  int64_t bytes = 0;
  // Saved, then modified in place later in the forward: the cache holds its
  // storage until the forward ends and then drops it (a demotion); it holds
  // no bytes for the recomputation. explain() reports these; budgeted
  // plans never keep such calls.
  bool demoted = false;
};

struct BudgetedPlan {
  // One policy per profile, in order.
  std::vector<Policy> policies;
  // Per profile: false where the plan leaves the region unchecked (its
  // policy's checkpoints() is false; it keeps its plain_bytes).
  std::vector<bool> checkpointed;
  int64_t budget_bytes = 0;
  // Predicted: bytes kept after the forward, and the time of the calls the
  // recomputation runs (the profiled calls before its stop but the kept and
  // offloaded ones; OpCallProfile::past_stop).
  // Both are the profiled shapes': the policies answer by (op, call index),
  // so at other shapes (another sequence length) they keep the same calls,
  // whose bytes are those shapes'. Plan per shape with sac::ShapePlans
  // (sac/lab/shape_plans.h).
  int64_t saved_bytes = 0;
  // The calls each policy saves, in order (their bytes sum to saved_bytes).
  std::vector<std::vector<SavedCall>> saved_calls;
  double recompute_seconds = 0;
  // Predicted, with offload as a choice: the bytes moved to host memory and
  // the time of their trips.
  int64_t offloaded_bytes = 0;
  double offload_seconds = 0;
  // Whether the plan is proven to recompute least within the budget. The
  // solver stops after ten million nodes; its plan then recomputes at most
  // `gap_seconds` more than the best one.
  bool exact = true;
  double gap_seconds = 0;
  double solver_seconds = 0;
};

// One budget shared by several regions (a model's blocks): the calls are
// chosen across all of them at once. With `offload`, calls on an
// accelerator may be offloaded (see above). With `unchecked_regions`, a
// region whose profile measured its plain bytes may be left unchecked (see
// above).
BudgetedPlan budgeted_plan(const std::vector<RegionProfile>& profiles, Budget budget,
                           std::optional<OffloadCost> offload = std::nullopt,
                           bool unchecked_regions = true);

// The policy of one region.
Policy budgeted_policy(const RegionProfile& profile, Budget budget,
                       std::optional<OffloadCost> offload = std::nullopt,
                       bool unchecked_regions = true);

}  // namespace sac
