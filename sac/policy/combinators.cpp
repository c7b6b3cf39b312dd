#include <sac/policy/combinators.h>

#include <sac/dispatch/internal/boxed.h>
#include <sac/policy/internal/op_names.h>
#include <sac/policy/internal/answers.h>

#include <c10/util/Exception.h>

#include <algorithm>

namespace sac {
namespace {

// How much of a call's outputs an answer keeps on the device.
int keep_rank(CheckpointPolicy answer) {
  return detail::is_save(answer) ? 2 : detail::is_offload(answer) ? 1 : 0;
}

enum class Prefer { MostKept, LeastKept };

// The rule of combinators.h: the most (or least) kept, then Must over
// Prefer, then the earlier answer.
bool beats(CheckpointPolicy candidate, CheckpointPolicy best, Prefer prefer) {
  if (keep_rank(candidate) != keep_rank(best)) {
    return prefer == Prefer::MostKept ? keep_rank(candidate) > keep_rank(best)
                                      : keep_rank(candidate) < keep_rank(best);
  }
  return detail::is_must(candidate) && !detail::is_must(best);
}

std::string describe_all(const char* name, const std::vector<Policy>& policies) {
  std::string out = std::string(name) + "(";
  for (size_t i = 0; i < policies.size(); ++i) {
    out += (i == 0 ? "" : ", ") + policies[i].describe();
  }
  return out + ")";
}

Policy::Domain united(const std::vector<Policy>& policies) {
  Policy::Domain domain;
  for (const auto& policy : policies) {
    domain = domain.united_with(policy.domain());
  }
  return domain;
}

class CombinedRule final : public Policy::Rule {
 public:
  CombinedRule(const char* name, std::vector<Policy> policies, Prefer prefer)
      : name_(name), policies_(std::move(policies)), prefer_(prefer) {
    TORCH_CHECK(!policies_.empty(), "sac::", name_, " got no policies; pass at least one.");
  }
  CheckpointPolicy decide(const SelectiveCheckpointContext& ctx, const c10::OperatorHandle& op,
                          c10::ArrayRef<c10::IValue> args) const override {
    CheckpointPolicy best = policies_[0].decide(ctx, op, args);
    for (size_t i = 1; i < policies_.size(); ++i) {
      const CheckpointPolicy answer = policies_[i].decide(ctx, op, args);
      if (beats(answer, best, prefer_)) {
        best = answer;
      }
    }
    return best;
  }
  Policy::Domain domain() const override { return united(policies_); }
  std::string describe() const override { return describe_all(name_, policies_); }

 private:
  const char* name_;
  std::vector<Policy> policies_;
  Prefer prefer_;
};

class ExceptRule final : public Policy::Rule {
 public:
  ExceptRule(Policy policy, Policy excluded)
      : policy_(std::move(policy)), excluded_(std::move(excluded)) {}
  CheckpointPolicy decide(const SelectiveCheckpointContext& ctx, const c10::OperatorHandle& op,
                          c10::ArrayRef<c10::IValue> args) const override {
    const CheckpointPolicy answer = policy_.decide(ctx, op, args);
    const CheckpointPolicy exclusion = excluded_.decide(ctx, op, args);
    if (!detail::is_kept(exclusion)) {
      return answer;
    }
    return detail::is_must(exclusion) || detail::is_must(answer)
               ? CheckpointPolicy::MustRecompute
               : CheckpointPolicy::PreferRecompute;
  }
  // Only the policy's ops can be kept; the exclusion is asked about those,
  // and about its tags: a tag it keeps recomputes the tagged value's call.
  Policy::Domain domain() const override {
    return policy_.domain().with_tags_of(excluded_.domain());
  }
  std::string describe() const override {
    return "except(" + policy_.describe() + ", " + excluded_.describe() + ")";
  }

 private:
  Policy policy_;
  Policy excluded_;
};

class EveryNthRule final : public Policy::Rule {
 public:
  EveryNthRule(std::string name, std::vector<c10::OperatorHandle> ops, int64_t n)
      : name_(std::move(name)), ops_(std::move(ops)), n_(static_cast<size_t>(n)) {}
  CheckpointPolicy decide(const SelectiveCheckpointContext& ctx, const c10::OperatorHandle& op,
                          c10::ArrayRef<c10::IValue>) const override {
    const bool listed = std::find(ops_.begin(), ops_.end(), op) != ops_.end();
    return listed && (ctx.call + 1) % n_ == 0 ? CheckpointPolicy::MustSave
                                              : CheckpointPolicy::PreferRecompute;
  }
  Policy::Domain domain() const override { return Policy::Domain::listed(ops_); }
  std::string describe() const override {
    return "every_nth(" + name_ + ", " + std::to_string(n_) + ")";
  }

 private:
  std::string name_;
  std::vector<c10::OperatorHandle> ops_;
  size_t n_;
};

// `policy`'s answer where `test(outputs)` holds, else `otherwise(answer)`.
class OutputTestRule final : public Policy::Rule {
 public:
  using Test = std::function<bool(c10::ArrayRef<c10::IValue> outputs)>;
  using Change = CheckpointPolicy (*)(CheckpointPolicy answer, bool passed);
  OutputTestRule(std::string name, Policy policy, Test test, Change change)
      : name_(std::move(name)),
        policy_(std::move(policy)),
        test_(std::move(test)),
        change_(change) {}
  CheckpointPolicy decide(const SelectiveCheckpointContext& ctx, const c10::OperatorHandle& op,
                          c10::ArrayRef<c10::IValue> args) const override {
    const CheckpointPolicy answer = policy_.decide(ctx, op, args);
    return change_(answer, test_(ctx.op_output));
  }
  Policy::Domain domain() const override { return policy_.domain(); }
  std::string describe() const override { return name_ + "(" + policy_.describe() + ")"; }

 private:
  std::string name_;
  Policy policy_;
  Test test_;
  Change change_;
};

// Whether every tensor among `outputs` satisfies `test`.
template <class Test>
bool every_tensor(c10::ArrayRef<c10::IValue> outputs, const Test& test) {
  bool all = true;
  for (const auto& output : outputs) {
    detail::for_each_tensor(output,
                            [&](const at::Tensor& t) { all = all && (!t.defined() || test(t)); });
  }
  return all;
}

CheckpointPolicy keep_if_passed(CheckpointPolicy answer, bool passed) {
  return passed ? answer : CheckpointPolicy::PreferRecompute;
}

CheckpointPolicy offload_if_passed(CheckpointPolicy answer, bool passed) {
  if (!passed || !detail::is_save(answer)) {
    return answer;
  }
  return detail::is_must(answer) ? CheckpointPolicy::MustCpuOffload
                                 : CheckpointPolicy::PreferCpuOffload;
}

}  // namespace

Policy any_of(std::vector<Policy> policies) {
  return Policy(std::make_shared<CombinedRule>("any_of", std::move(policies), Prefer::MostKept));
}

Policy all_of(std::vector<Policy> policies) {
  return Policy(std::make_shared<CombinedRule>("all_of", std::move(policies), Prefer::LeastKept));
}

Policy except(Policy policy, Policy excluded) {
  return Policy(std::make_shared<ExceptRule>(std::move(policy), std::move(excluded)));
}

Policy every_nth(const std::string& op_name, int64_t n) {
  TORCH_CHECK(n >= 1, "sac::every_nth(", op_name, ", ", n, "): n must be at least 1.");
  // Resolved and checked as save_ops resolves its names.
  const Policy listed = Policy::save_ops({op_name});
  return Policy(std::make_shared<EveryNthRule>(op_name, listed.domain().ops, n));
}

Policy for_shapes(Policy policy, std::function<bool(c10::IntArrayRef sizes)> keep_if) {
  TORCH_CHECK(static_cast<bool>(keep_if), "sac::for_shapes got an empty predicate.");
  return Policy(std::make_shared<OutputTestRule>(
      "for_shapes", std::move(policy),
      [keep_if = std::move(keep_if)](c10::ArrayRef<c10::IValue> outputs) {
        return every_tensor(outputs, [&](const at::Tensor& t) { return keep_if(t.sizes()); });
      },
      &keep_if_passed));
}

Policy offload_if(Policy policy, std::function<bool(const at::Tensor&)> offload) {
  TORCH_CHECK(static_cast<bool>(offload), "sac::offload_if got an empty predicate.");
  return Policy(std::make_shared<OutputTestRule>(
      "offload_if", std::move(policy),
      [offload = std::move(offload)](c10::ArrayRef<c10::IValue> outputs) {
        return every_tensor(outputs, offload);
      },
      &offload_if_passed));
}

Policy offload_if(Policy policy, int64_t min_bytes) {
  return Policy(std::make_shared<OutputTestRule>(
      "offload_if(min_bytes=" + std::to_string(min_bytes) + ")", std::move(policy),
      [min_bytes](c10::ArrayRef<c10::IValue> outputs) {
        int64_t bytes = 0;
        for (const auto& output : outputs) {
          detail::for_each_tensor(output, [&](const at::Tensor& t) {
            bytes += t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
          });
        }
        return bytes >= min_bytes;
      },
      &offload_if_passed));
}

}  // namespace sac
