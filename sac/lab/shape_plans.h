// sac::ShapePlans: plans that follow the shape of the data. Batches change
// shape (sequence lengths, packed documents, routed tokens); one static plan
// is wasteful for short ones and over the limit for long ones. ShapePlans
// holds one plan per input-shape signature, solved the first time the
// signature appears and reused after.
//
//   sac::ShapePlans plans([&](const sac::ShapePlans::Signature& shape) {
//     // profile the regions at this shape, measure one step under full
//     // recomputation, and plan for the peak budget (sac/lab/peak.h)
//     return phases.plan_for_peak(profiles, budget).plan.policies;
//   });
//   for (auto& batch : batches) {
//     const auto& policies = plans.policies_for({batch.size(0), batch.size(1)});
//     ...  // one region per block, under policies[i]
//   }
//
// The signature is what the caller says decides the plan (the input's
// sizes, usually); the solve is the caller's too, so that the budget may be
// bytes or the allocator's free memory read at solve time
// (sac::MemoryProbe::free, sac/lab/peak.h).
#pragma once

#include <sac/policy/policy.h>

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

namespace sac {

class ShapePlans {
 public:
  using Signature = std::vector<int64_t>;
  using Solve = std::function<std::vector<Policy>(const Signature&)>;

  explicit ShapePlans(Solve solve);

  // The plan for `signature`: solved now if it is new (which may run the
  // step's regions to profile them), else the one solved before.
  const std::vector<Policy>& policies_for(const Signature& signature);

  // Signatures solved so far, and the wall time each solve took, in order.
  size_t solved() const { return plans_.size(); }
  const std::vector<double>& solve_seconds() const { return solve_seconds_; }

 private:
  Solve solve_;
  std::map<Signature, std::vector<Policy>> plans_;
  std::vector<double> solve_seconds_;
};

}  // namespace sac
