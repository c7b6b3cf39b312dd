#include <sac/lab/budget.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <utility>

namespace sac {
namespace {

// MustSave for the chosen (op, call) pairs.
class ChosenCallsRule final : public Policy::Rule {
 public:
  ChosenCallsRule(std::vector<std::pair<c10::OperatorHandle, size_t>> chosen, std::string description)
      : chosen_(std::move(chosen)), description_(std::move(description)) {
    for (const auto& [op, call] : chosen_) {
      if (std::find(ops_.begin(), ops_.end(), op) == ops_.end()) {
        ops_.push_back(op);
      }
    }
  }
  CheckpointPolicy decide(const SelectiveCheckpointContext& ctx, const c10::OperatorHandle& op,
                          c10::ArrayRef<c10::IValue>) const override {
    for (const auto& [chosen_op, call] : chosen_) {
      if (call == ctx.call && chosen_op == op) {
        return CheckpointPolicy::MustSave;
      }
    }
    return CheckpointPolicy::PreferRecompute;
  }
  OpDomain domain() const override { return OpDomain::listed(ops_); }
  std::string describe() const override { return description_; }

 private:
  std::vector<std::pair<c10::OperatorHandle, size_t>> chosen_;
  std::vector<c10::OperatorHandle> ops_;
  std::string description_;
};

}  // namespace

Budget Budget::bytes(int64_t bytes) {
  TORCH_CHECK(bytes >= 0, "sac::Budget::bytes: a budget must not be negative; got ", bytes, ".");
  return Budget(bytes, 0);
}

Budget Budget::fraction(double fraction) {
  TORCH_CHECK(fraction >= 0 && fraction <= 1, "sac::Budget::fraction: expected a fraction "
              "of the bytes everything_saveable() keeps, in [0, 1]; got ", fraction, ".");
  return Budget(-1, fraction);
}

int64_t Budget::resolve(int64_t everything) const {
  return bytes_ >= 0 ? bytes_
                     : static_cast<int64_t>(std::floor(fraction_ * static_cast<double>(everything)));
}

BudgetedPlan budgeted_plan(const std::vector<RegionProfile>& profiles, Budget budget) {
  std::vector<lab::Item> items;
  std::vector<std::pair<size_t, const OpCallProfile*>> where;  // (profile, call) per item
  int64_t everything = 0;
  double recompute_all = 0;  // every call runs again unless kept
  for (size_t p = 0; p < profiles.size(); ++p) {
    for (const auto& call : profiles[p].calls()) {
      recompute_all += call.seconds;
      if (!call.keepable()) {
        continue;
      }
      items.push_back({call.output_bytes, call.seconds});
      where.emplace_back(p, &call);
      everything += call.output_bytes;
    }
  }
  BudgetedPlan plan;
  plan.budget_bytes = budget.resolve(everything);
  const auto start = std::chrono::steady_clock::now();
  plan.choice = lab::solve_knapsack(items, plan.budget_bytes);
  plan.solver_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  plan.kept_bytes = plan.choice.weight;
  plan.recompute_seconds = recompute_all - plan.choice.value;
  std::vector<std::vector<std::pair<c10::OperatorHandle, size_t>>> chosen(profiles.size());
  for (const size_t i : plan.choice.chosen) {
    chosen[where[i].first].emplace_back(where[i].second->op, where[i].second->call);
  }
  for (size_t p = 0; p < profiles.size(); ++p) {
    plan.policies.emplace_back(std::make_shared<ChosenCallsRule>(
        std::move(chosen[p]), "budgeted(" + std::to_string(plan.budget_bytes) + " bytes)"));
  }
  return plan;
}

Policy budgeted_policy(const RegionProfile& profile, Budget budget) {
  return budgeted_plan({profile}, budget).policies.front();
}

}  // namespace sac
