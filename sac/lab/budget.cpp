#include <sac/lab/budget.h>

#include <sac/lab/internal/choices.h>
#include <sac/lab/internal/knapsack.h>

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace sac {
namespace {

// Its answer for each chosen (op, call) pair: MustSave or MustCpuOffload.
class ChosenCallsRule final : public Policy::Rule {
 public:
  struct Chosen {
    c10::OperatorHandle op;
    size_t call_index;
    CheckpointPolicy answer;
  };

  ChosenCallsRule(std::vector<Chosen> chosen, std::string description)
      : chosen_(std::move(chosen)), description_(std::move(description)) {
    for (const auto& c : chosen_) {
      if (std::find(ops_.begin(), ops_.end(), c.op) == ops_.end()) {
        ops_.push_back(c.op);
      }
    }
  }
  CheckpointPolicy decide(const SelectiveCheckpointContext& ctx, const c10::OperatorHandle& op,
                          c10::ArrayRef<c10::IValue>) const override {
    for (const auto& c : chosen_) {
      if (c.call_index == ctx.call && c.op == op) {
        return c.answer;
      }
    }
    return CheckpointPolicy::PreferRecompute;
  }
  Policy::Domain domain() const override { return Policy::Domain::listed(ops_); }
  std::string describe() const override { return description_; }

 private:
  std::vector<Chosen> chosen_;
  std::vector<c10::OperatorHandle> ops_;
  std::string description_;
};

// A region the plan leaves unchecked. Under a checkpoint all the same (in a
// combinator, whose policy checkpoints) it keeps every call.
class UncheckedRule final : public Policy::Rule {
 public:
  explicit UncheckedRule(std::string description) : description_(std::move(description)) {}
  CheckpointPolicy decide(const SelectiveCheckpointContext&, const c10::OperatorHandle&,
                          c10::ArrayRef<c10::IValue>) const override {
    return CheckpointPolicy::MustSave;
  }
  Policy::Domain domain() const override { return Policy::Domain::every_cacheable(); }
  std::string describe() const override { return description_; }
  bool checkpoints() const override { return false; }

 private:
  std::string description_;
};

// What the regions keep unchecked together; -1 if a profile did not measure
// it (made by hand).
int64_t plain_bytes_of(const std::vector<RegionProfile>& profiles) {
  int64_t plain = 0;
  for (const RegionProfile& profile : profiles) {
    if (profile.plain_bytes() < 0) return -1;
    plain += profile.plain_bytes();
  }
  return plain;
}

double checked_fraction(double fraction, const char* constructor, const char* whole) {
  TORCH_CHECK(fraction >= 0 && fraction <= 1, "sac::Budget::", constructor,
              ": expected a fraction of ", whole, ", in [0, 1]; got ", fraction, ".");
  return fraction;
}

}  // namespace

Budget Budget::bytes(int64_t bytes) {
  TORCH_CHECK(bytes >= 0, "sac::Budget::bytes: a budget must not be negative; got ", bytes, ".");
  return Budget(Of::Bytes, bytes, 0);
}

Budget Budget::fraction(double fraction) {
  return Budget(Of::Plain, 0,
                checked_fraction(fraction, "fraction", "the bytes the regions keep unchecked"));
}

Budget Budget::of_everything_saveable(double fraction) {
  return Budget(Of::Everything, 0,
                checked_fraction(fraction, "of_everything_saveable",
                                 "the bytes everything_saveable() keeps"));
}

int64_t Budget::resolve(int64_t plain, int64_t everything) const {
  const auto part = [&](int64_t whole) {
    return static_cast<int64_t>(std::floor(fraction_ * static_cast<double>(whole)));
  };
  switch (of_) {
    case Of::Bytes: return bytes_;
    case Of::Plain:
      TORCH_CHECK(plain >= 0,
                  "sac::Budget::fraction: a profile did not measure what its region keeps "
                  "unchecked (RegionProfile::plain_bytes() is -1: a profile made by hand, or "
                  "of a region that returns nothing, whose graph dies with its output). "
                  "Profile each region with sac::profile of a function that returns its "
                  "outputs, or give the budget in bytes or of_everything_saveable.");
      return part(plain);
    case Of::Everything: return part(everything);
  }
  TORCH_INTERNAL_ASSERT(false, "sac::Budget: unknown kind");
}

double measure_offload_bandwidth(c10::Device device, int64_t bytes) {
  TORCH_CHECK(device.type() != c10::kCPU,
              "sac::measure_offload_bandwidth: offload moves an accelerator's tensors to "
              "host memory, but the device given is the CPU (host_memory() leaves CPU "
              "tensors where they are). Pass the accelerator the model runs on.");
  TORCH_CHECK(bytes > 0, "sac::measure_offload_bandwidth: bytes must be positive; got ", bytes,
              ".");
  const at::Tensor on_device = at::empty({bytes}, at::TensorOptions(at::kByte).device(device));
  const at::Tensor host = at::empty({bytes}, at::TensorOptions(at::kByte).pinned_memory(true));
  double best = std::numeric_limits<double>::infinity();
  for (int trial = 0; trial < 4; ++trial) {  // the first warms up
    const auto start = std::chrono::steady_clock::now();
    host.copy_(on_device, /*non_blocking=*/false);
    on_device.copy_(host, /*non_blocking=*/false);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = trial == 0 ? best : std::min(best, seconds);
  }
  return static_cast<double>(bytes) / best;
}

BudgetedPlan budgeted_plan(const std::vector<RegionProfile>& profiles, Budget budget,
                           std::optional<OffloadCost> offload, bool unchecked_regions) {
  TORCH_CHECK(!offload.has_value() || offload->bytes_per_second > 0,
              "sac::budgeted_plan: an offload bandwidth must be positive; got ",
              offload->bytes_per_second,
              " bytes per second (measure it with "
              "sac::measure_offload_bandwidth).");
  std::vector<detail::Item> items;
  std::vector<detail::CallChoice> choices;
  std::vector<size_t> item_of_choice;
  constexpr size_t kNoItem = static_cast<size_t>(-1);
  std::vector<size_t> unchecked_item(profiles.size(), kNoItem);
  int64_t everything = 0;
  for (size_t p = 0; p < profiles.size(); ++p) {
    const int group = static_cast<int>(p);
    // What a checkpoint of the region costs with nothing kept: the
    // recomputation of every call before its stop, or the trip of those
    // cheaper to offload.
    double region_cost = 0;
    for (const auto& call : profiles[p].calls()) {
      region_cost += call.recompute_seconds();
    }
    for (detail::CallChoice& choice : detail::choices_of(profiles[p], p, offload)) {
      for (const OpCallProfile* call : choice.calls) {
        region_cost -= call->recompute_seconds();
      }
      region_cost += choice.left.seconds;
      everything += choice.bytes;
      // Calls past the recomputation's stop cost nothing left out: keeping
      // them would hold bytes for nothing.
      const bool worth_keeping = choice.left.seconds > 0;
      item_of_choice.push_back(worth_keeping ? items.size() : kNoItem);
      if (worth_keeping) {
        items.push_back({choice.bytes, choice.left.seconds, group, false});
      }
      choices.push_back(std::move(choice));
    }
    if (unchecked_regions && profiles[p].plain_bytes() >= 0) {
      // All of that saved, and a picosecond: below the clock's resolution,
      // so that only an exact tie with keeping every call goes to the region
      // unchecked (a nanosecond chose it over calls worth one more).
      unchecked_item[p] = items.size();
      items.push_back({profiles[p].plain_bytes(), region_cost + 1e-12, group, true});
    }
  }
  BudgetedPlan plan;
  plan.budget_bytes = budget.resolve(plain_bytes_of(profiles), everything);
  const auto start = std::chrono::steady_clock::now();
  const detail::Choice choice = detail::solve_knapsack(items, plan.budget_bytes);
  plan.solver_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  plan.exact = choice.exact;
  plan.gap_seconds = choice.exact ? 0 : choice.upper_bound - choice.value;
  plan.saved_bytes = choice.weight;
  std::vector<bool> kept(items.size(), false);
  for (const size_t i : choice.chosen) {
    kept[i] = true;
  }
  std::vector<std::vector<ChosenCallsRule::Chosen>> chosen(profiles.size());
  plan.saved_calls.resize(profiles.size());
  plan.checkpointed.resize(profiles.size());
  for (size_t p = 0; p < profiles.size(); ++p) {
    plan.checkpointed[p] = unchecked_item[p] == kNoItem || !kept[unchecked_item[p]];
  }
  std::unordered_set<const OpCallProfile*> not_rerun;  // kept or offloaded
  for (size_t i = 0; i < choices.size(); ++i) {
    const detail::CallChoice& c = choices[i];
    if (!plan.checkpointed[c.profile] || item_of_choice[i] == kNoItem) {
      continue;
    }
    const bool keep = kept[item_of_choice[i]];
    if (!keep && !c.left.offloaded) {
      continue;
    }
    for (const OpCallProfile* call : c.calls) {
      chosen[c.profile].push_back(
          {call->op, call->call,
           keep ? CheckpointPolicy::MustSave : CheckpointPolicy::MustCpuOffload});
      not_rerun.insert(call);
      if (keep) {  // the choice's bytes go with its first call
        plan.saved_calls[c.profile].push_back(
            {call->op, call->call, call == c.calls.front() ? c.bytes : 0});
      }
    }
    if (!keep) {
      plan.offloaded_bytes += c.bytes;
      plan.offload_seconds += c.left.seconds;
    }
  }
  // A checkpointed region's every call before the stop runs again unless
  // kept or offloaded.
  for (size_t p = 0; p < profiles.size(); ++p) {
    for (const auto& call : profiles[p].calls()) {
      const bool rerun = plan.checkpointed[p] && not_rerun.count(&call) == 0;
      plan.recompute_seconds += rerun ? call.recompute_seconds() : 0;
    }
  }
  const std::string budgeted = "budgeted(" + std::to_string(plan.budget_bytes) + " bytes" +
                               (offload.has_value() ? ", offload" : "") + ")";
  for (size_t p = 0; p < profiles.size(); ++p) {
    if (plan.checkpointed[p]) {
      plan.policies.emplace_back(std::make_shared<ChosenCallsRule>(std::move(chosen[p]), budgeted));
    } else {
      plan.policies.emplace_back(std::make_shared<UncheckedRule>("unchecked, " + budgeted));
    }
  }
  return plan;
}

namespace detail {

BudgetedPlan plan_keeping_nothing(const std::vector<RegionProfile>& profiles) {
  BudgetedPlan plan;
  plan.checkpointed.assign(profiles.size(), true);
  plan.saved_calls.resize(profiles.size());
  for (const RegionProfile& profile : profiles) {
    plan.policies.emplace_back(std::make_shared<ChosenCallsRule>(
        std::vector<ChosenCallsRule::Chosen>{}, "budgeted(nothing)"));
    for (const OpCallProfile& call : profile.calls()) {
      plan.recompute_seconds += call.recompute_seconds();
    }
  }
  return plan;
}

BudgetedPlan plan_unchecked(const std::vector<RegionProfile>& profiles) {
  BudgetedPlan plan;
  plan.checkpointed.assign(profiles.size(), false);
  plan.saved_calls.resize(profiles.size());
  plan.saved_bytes = plain_bytes_of(profiles);
  for (size_t p = 0; p < profiles.size(); ++p) {
    plan.policies.emplace_back(std::make_shared<UncheckedRule>("unchecked"));
  }
  return plan;
}

}  // namespace detail

Policy budgeted_policy(const RegionProfile& profile, Budget budget,
                       std::optional<OffloadCost> offload, bool unchecked_regions) {
  return budgeted_plan({profile}, budget, offload, unchecked_regions).policies.front();
}

}  // namespace sac
