#include <sac/lab/explain.h>

#include <sac/base/context.h>
#include <sac/cache/internal/op_cache.h>
#include <sac/cache/selective_modes.h>
#include <sac/policy/internal/answers.h>
#include <sac/policy/internal/tag.h>
#include <sac/cache/internal/selective_modes.h>

#include <iomanip>
#include <optional>
#include <ostream>
#include <string>
#include <unordered_map>
#include <utility>

namespace sac {
namespace {

// The policy's rule, remembering each answer by (op, call).
class RememberingRule final : public Policy::Rule {
 public:
  explicit RememberingRule(Policy policy) : policy_(std::move(policy)) {}
  CheckpointPolicy decide(const SelectiveCheckpointContext& ctx, const c10::OperatorHandle& op,
                          c10::ArrayRef<c10::IValue> args) const override {
    const CheckpointPolicy answer = policy_.decide(ctx, op, args);
    answers[op][ctx.call] = answer;
    return answer;
  }
  Policy::Domain domain() const override { return policy_.domain(); }
  std::string describe() const override { return policy_.describe(); }

  std::optional<CheckpointPolicy> answer_for(const c10::OperatorHandle& op,
                                             size_t call_index) const {
    const auto of_op = answers.find(op);
    if (of_op == answers.end()) {
      return std::nullopt;
    }
    const auto it = of_op->second.find(call_index);
    return it == of_op->second.end() ? std::nullopt : std::make_optional(it->second);
  }

  // Per op, per call index.
  mutable std::unordered_map<c10::OperatorHandle, std::unordered_map<size_t, CheckpointPolicy>>
      answers;

 private:
  Policy policy_;
};

const char* to_string(ExplainedCall::Outcome outcome) {
  switch (outcome) {
    case ExplainedCall::Outcome::NotDecided: return "-";
    case ExplainedCall::Outcome::Saved: return "saved";
    case ExplainedCall::Outcome::Offloaded: return "offloaded";
    case ExplainedCall::Outcome::Recomputed: return "recomputed";
    case ExplainedCall::Outcome::Demoted: return "demoted";
  }
  return "?";
}

// The copy target of a dry run: nothing leaves the device, but the cache
// still notes which outputs an offload answer sends away.
class NoCopies final : public CopyTarget {
 public:
  bool accepts(const at::Tensor&) const override { return false; }
  at::Tensor copy_out(const at::Tensor& t) override { return t; }
  at::Tensor copy_back(const at::Tensor& copy, const CopyTarget::Origin&) override { return copy; }
};

}  // namespace

std::vector<SavedCall> Explanation::saved_calls() const {
  std::vector<bool> counted(calls_.size(), false);  // storages, at their maker
  std::vector<SavedCall> kept;
  for (size_t i = 0; i < calls_.size(); ++i) {
    const ExplainedCall& c = calls_[i];
    if (c.outcome == ExplainedCall::Outcome::Demoted) {
      kept.push_back({c.profile.op, c.profile.call, 0, /*demoted=*/true});
    }
    if (c.outcome != ExplainedCall::Outcome::Saved) {
      continue;
    }
    int64_t bytes = 0;
    const std::vector<size_t> own{i};
    for (const size_t maker :
         c.profile.shares_storage_with.empty() ? own : c.profile.shares_storage_with) {
      if (!counted[maker]) {
        counted[maker] = true;
        bytes += calls_[maker].profile.output_bytes;
      }
    }
    kept.push_back({c.profile.op, c.profile.call, bytes});
  }
  return kept;
}

int64_t Explanation::saved_bytes() const {
  int64_t bytes = 0;
  for (const auto& k : saved_calls()) {
    bytes += k.bytes;
  }
  return bytes;
}

int64_t Explanation::offloaded_bytes() const {
  int64_t bytes = 0;
  for (const auto& c : calls_) {
    bytes += c.outcome == ExplainedCall::Outcome::Offloaded ? c.profile.output_bytes : 0;
  }
  return bytes;
}

double Explanation::recompute_seconds() const {
  double seconds = 0;
  for (const auto& c : calls_) {
    const bool kept = c.outcome == ExplainedCall::Outcome::Saved ||
                      c.outcome == ExplainedCall::Outcome::Offloaded;
    seconds += kept ? 0 : c.profile.recompute_seconds();
  }
  return seconds;
}

void Explanation::print(std::ostream& out) const {
  out << std::left << std::setw(48) << "op" << std::right << std::setw(6) << "call" << std::setw(14)
      << "bytes" << std::setw(12) << "us"
      << "  " << std::left << std::setw(18) << "answer"
      << "outcome\n";
  for (const auto& c : calls_) {
    out << std::left << std::setw(48) << c10::toString(c.profile.op.operator_name()) << std::right
        << std::setw(6) << c.profile.call << std::setw(14) << c.profile.output_bytes
        << std::setw(12) << std::fixed << std::setprecision(1) << c.profile.seconds * 1e6 << "  "
        << std::left << std::setw(18)
        << (c.answer.has_value() ? std::string(to_string(*c.answer)) : std::string("-"))
        << (c.profile.past_stop && c.outcome != ExplainedCall::Outcome::Saved &&
                    c.outcome != ExplainedCall::Outcome::Offloaded
                ? "past stop"
                : to_string(c.outcome))
        << "\n";
  }
  out << std::right << "kept " << saved_bytes() << " bytes, offloaded " << offloaded_bytes()
      << " bytes, recomputed " << std::setprecision(1) << recompute_seconds() * 1e6 << " us\n";
}

Explanation explain(const Policy& policy, const std::function<void()>& region) {
  auto rule = std::make_shared<RememberingRule>(policy);
  const Policy remembering(rule);
  auto contexts =
      create_selective_checkpoint_contexts(remembering, false, std::make_shared<NoCopies>());
  // One run: the caching mode fills the cache for one forward.
  const RegionProfile profiled = profile(
      [&] {
        RegionContext::Scope caching(contexts.caching.get());
        region();
      },
      /*runs=*/1);
  auto demoted = [&](const c10::OperatorHandle& op, size_t call_index) {
    for (const auto& d : detail::cache_of(contexts)->demotions()) {
      if (d.call_index == call_index && d.op == op.operator_name()) {
        return true;
      }
    }
    return false;
  };
  std::vector<ExplainedCall> calls;
  for (const auto& call : profiled.calls()) {
    ExplainedCall explained{call, std::nullopt, ExplainedCall::Outcome::NotDecided};
    const auto answer = rule->answer_for(call.op, call.call);
    if (answer.has_value() && !detail::is_tag(call.op)) {
      explained.answer = answer;
      const bool kept = detail::cache_of(contexts)->cached(call.op, call.call);
      explained.outcome = kept ? detail::is_offload(*answer) ? ExplainedCall::Outcome::Offloaded
                                                             : ExplainedCall::Outcome::Saved
                          : demoted(call.op, call.call) ? ExplainedCall::Outcome::Demoted
                                                        : ExplainedCall::Outcome::Recomputed;
    }
    calls.push_back(std::move(explained));
  }
  return Explanation(std::move(calls));
}

}  // namespace sac
