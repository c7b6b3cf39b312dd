#include <sac/policy/policy.h>

#include <sac/dispatch/internal/interceptor.h>
#include <sac/policy/internal/op_names.h>
#include <sac/policy/internal/op_traits.h>
#include <sac/policy/internal/answers.h>
#include <sac/policy/internal/tag.h>
#include <sac/dispatch/internal/registry.h>

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>

namespace sac {

std::string_view to_string(CheckpointPolicy answer) {
  switch (answer) {
    case CheckpointPolicy::MustSave: return "MustSave";
    case CheckpointPolicy::PreferSave: return "PreferSave";
    case CheckpointPolicy::MustRecompute: return "MustRecompute";
    case CheckpointPolicy::PreferRecompute: return "PreferRecompute";
    case CheckpointPolicy::MustCpuOffload: return "MustCpuOffload";
    case CheckpointPolicy::PreferCpuOffload: return "PreferCpuOffload";
  }
  return "unknown";
}

// ---- Policy::Domain ------------------------------------------------------------

bool Policy::Domain::contains(const c10::OperatorHandle& op) const {
  if (detail::is_tag(op)) {
    return tags;
  }
  if (every_cacheable_op) {
    return detail::is_cacheable(op);
  }
  return std::find(ops.begin(), ops.end(), op) != ops.end();
}

Policy::Domain Policy::Domain::united_with(const Policy::Domain& other) const {
  Policy::Domain out = with_tags_of(other);
  if (every_cacheable_op || other.every_cacheable_op) {
    out.every_cacheable_op = true;
    out.ops.clear();
    return out;
  }
  for (const auto& op : other.ops) {
    if (std::find(out.ops.begin(), out.ops.end(), op) == out.ops.end()) {
      out.ops.push_back(op);
    }
  }
  return out;
}

Policy::Domain Policy::Domain::with_tags_of(const Policy::Domain& other) const {
  Policy::Domain out = *this;
  out.tags = tags || other.tags;
  for (const auto& name : other.names) {
    if (std::find(out.names.begin(), out.names.end(), name) == out.names.end()) {
      out.names.push_back(name);
    }
  }
  return out;
}

// ---- Rules of the factories ---------------------------------------------------

namespace {

// The listed ops get `answer`; the rest PreferRecompute.
class OpListRule final : public Policy::Rule {
 public:
  OpListRule(std::vector<c10::OperatorHandle> ops, CheckpointPolicy answer, std::string description)
      : ops_(std::move(ops)), answer_(answer), description_(std::move(description)) {}

  CheckpointPolicy decide(const SelectiveCheckpointContext&, const c10::OperatorHandle& op,
                          c10::ArrayRef<c10::IValue>) const override {
    return std::find(ops_.begin(), ops_.end(), op) != ops_.end()
               ? answer_
               : CheckpointPolicy::PreferRecompute;
  }
  Policy::Domain domain() const override { return Policy::Domain::listed(ops_); }
  std::string describe() const override { return description_; }

 private:
  std::vector<c10::OperatorHandle> ops_;
  CheckpointPolicy answer_;
  std::string description_;
};

// "prefix(name, name, ...)" with the names as written.
std::string listing(const std::string& prefix, const std::vector<std::string>& names) {
  return prefix + c10::Join(", ", names) + ")";
}

class CallbackRule final : public Policy::Rule {
 public:
  explicit CallbackRule(Policy::Fn fn) : fn_(std::move(fn)) {}
  CheckpointPolicy decide(const SelectiveCheckpointContext& ctx, const c10::OperatorHandle& op,
                          c10::ArrayRef<c10::IValue> args) const override {
    return fn_(ctx, op, args);
  }
  Policy::Domain domain() const override { return Policy::Domain::every_cacheable(); }
  std::string describe() const override { return "callback"; }

 private:
  Policy::Fn fn_;
};

// The operators `op_names` denote, for a list that must keep each of them.
std::vector<c10::OperatorHandle> resolve_cacheable(const std::vector<std::string>& op_names,
                                                   const char* factory) {
  std::vector<c10::OperatorHandle> ops;
  for (const auto& name : op_names) {
    const auto resolved = detail::resolve_op_name(name);
    const bool explicit_all = name.size() > 2 && name.substr(name.size() - 2) == ".*";
    size_t kept = 0;
    for (const auto& op : resolved) {
      const auto why_not = detail::why_never_cached(op);
      if (why_not.has_value()) {
        // "ns::name.*" asks for the overloads that can be cached; naming
        // one op that never can is a mistake to report.
        TORCH_CHECK(explicit_all, "sac: Policy::", factory, " cannot save '", name, "' (",
                    c10::toString(op.operator_name()), "): ", *why_not,
                    ". Remove it from the list.");
        continue;
      }
      if (std::find(ops.begin(), ops.end(), op) == ops.end()) {
        ops.push_back(op);
      }
      ++kept;
    }
    TORCH_CHECK(kept > 0, "sac: Policy::", factory, ": no overload of '", name,
                "' can be cached (they are views, in-place or out= ops, or "
                "decompose above autograd). Remove it from the list.");
  }
  return ops;
}

}  // namespace

// ---- Policy -------------------------------------------------------------------

Policy::Policy(std::shared_ptr<const Rule> rule) : rule_(std::move(rule)) {
  TORCH_CHECK(rule_ != nullptr, "sac: a Policy needs a rule; got a null one.");
  domain_ = std::make_shared<const Policy::Domain>(rule_->domain());
}

Policy Policy::save_ops(const std::vector<std::string>& op_names) {
  TORCH_CHECK(!op_names.empty(), "sac: Policy::save_ops got an empty op list, which would save "
                                 "nothing (full recomputation). Name the ops to save, or "
                                 "checkpoint without a policy (or with sac::nothing_saveable()) "
                                 "for full recomputation.");
  return answer_ops(resolve_cacheable(op_names, "save_ops"), CheckpointPolicy::MustSave,
                    listing("save_ops(", op_names));
}

Policy Policy::answer_ops(const std::vector<std::string>& op_names, CheckpointPolicy answer) {
  TORCH_CHECK(!op_names.empty(),
              "sac: Policy::answer_ops got an empty op list; name "
              "the ops that get ",
              to_string(answer), ".");
  return answer_ops(resolve_cacheable(op_names, "answer_ops"), answer,
                    listing("answer_ops(" + std::string(to_string(answer)) + ", ", op_names));
}

Policy Policy::answer_ops(std::vector<c10::OperatorHandle> ops, CheckpointPolicy answer,
                          std::string description) {
  if (answer != CheckpointPolicy::PreferRecompute && answer != CheckpointPolicy::MustRecompute) {
    for (const auto& op : ops) {
      TORCH_CHECK(!detail::mechanism_misses(op), "sac: ", description, " names ",
                  op.operator_name(),
                  ", whose calls through LibTorch's torch:: factory "
                  "functions (torch::zeros, torch::arange, torch::randn_like, ...) sac's "
                  "per-op kernels never see: those functions dispatch below the "
                  "ADInplaceOrView key where the kernels sit. The policy would not "
                  "keep what it names. Use the fallback-key mechanism "
                  "(SAC_DISPATCH=fallback), which sees every call, or drop the op.");
    }
  }
  return Policy(std::make_shared<OpListRule>(std::move(ops), answer, std::move(description)));
}

Policy Policy::from_fn(Fn fn) {
  TORCH_CHECK(static_cast<bool>(fn), "sac: Policy::from_fn got an empty std::function; pass a "
                                     "callable that returns a sac::CheckpointPolicy or a bool.");
  return Policy(std::make_shared<CallbackRule>(std::move(fn)));
}

Policy Policy::from_fn(BoolFn fn) {
  TORCH_CHECK(static_cast<bool>(fn), "sac: Policy::from_fn got an empty std::function; pass a "
                                     "callable that returns a sac::CheckpointPolicy or a bool.");
  return from_fn(
      Fn([fn = std::move(fn)](const SelectiveCheckpointContext& ctx, const c10::OperatorHandle& op,
                              c10::ArrayRef<c10::IValue> args) {
        return detail::policy_from_bool(fn(ctx, op, args));
      }));
}

bool Policy::is_tag_op(const c10::OperatorHandle& op) { return detail::is_tag(op); }

void Policy::prepare_interception() const {
  if (domain_->every_cacheable_op) {
    detail::intercept_ops_matching(&detail::is_cacheable);
  } else {
    detail::intercept_ops(domain_->ops);
  }
  if (domain_->tags) {
    detail::intercept_ops({detail::tag_op()});
  }
}

}  // namespace sac
