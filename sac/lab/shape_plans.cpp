#include <sac/lab/shape_plans.h>

#include <c10/util/Exception.h>

#include <chrono>
#include <utility>

namespace sac {

ShapePlans::ShapePlans(Solve solve) : solve_(std::move(solve)) {
  TORCH_CHECK(solve_, "sac::ShapePlans: give a function that solves a plan for a signature.");
}

const std::vector<Policy>& ShapePlans::policies_for(const Signature& signature) {
  if (const auto found = plans_.find(signature); found != plans_.end()) {
    return found->second;
  }
  const auto start = std::chrono::steady_clock::now();
  std::vector<Policy> policies = solve_(signature);
  solve_seconds_.push_back(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return plans_.emplace(signature, std::move(policies)).first->second;
}

}  // namespace sac
