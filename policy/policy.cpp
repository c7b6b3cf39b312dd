#include <sac/policy/policy.h>

#include <sac/dispatch/interceptor.h>
#include <sac/policy/op_names.h>
#include <sac/policy/op_traits.h>

#include <c10/util/Exception.h>

#include <algorithm>

namespace sac {

std::string_view to_string(CheckpointPolicy policy) {
  switch (policy) {
    case CheckpointPolicy::MustSave:
      return "MustSave";
    case CheckpointPolicy::PreferSave:
      return "PreferSave";
    case CheckpointPolicy::MustRecompute:
      return "MustRecompute";
    case CheckpointPolicy::PreferRecompute:
      return "PreferRecompute";
  }
  return "unknown";
}

struct Policy::Impl {
  std::vector<c10::OperatorHandle> ops;  // save_ops
  std::vector<std::string> names;        // save_ops, as written
  Fn fn;                                 // callbacks
};

Policy::Policy(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Policy Policy::save_ops(const std::vector<std::string>& op_names) {
  TORCH_CHECK(!op_names.empty(),
              "sac: Policy::save_ops got an empty op list, which would save "
              "nothing (full recomputation). Name the ops to save, or "
              "checkpoint without a policy for full recomputation.");
  auto impl = std::make_shared<Impl>();
  for (const auto& name : op_names) {
    const auto resolved = policy::resolve_op_name(name);
    const bool explicit_all = name.size() > 2 && name.substr(name.size() - 2) == ".*";
    size_t kept = 0;
    for (const auto& op : resolved) {
      const auto why_not = policy::why_never_cached(op);
      if (why_not.has_value()) {
        // "ns::name.*" asks for the overloads that can be cached; naming
        // one op that never can is a mistake to report.
        TORCH_CHECK(explicit_all, "sac: Policy::save_ops cannot save '", name,
                    "' (", c10::toString(op.operator_name()), "): ", *why_not,
                    ". Remove it from the list.");
        continue;
      }
      if (std::find(impl->ops.begin(), impl->ops.end(), op) == impl->ops.end()) {
        impl->ops.push_back(op);
      }
      ++kept;
    }
    TORCH_CHECK(kept > 0, "sac: Policy::save_ops: no overload of '", name,
                "' can be cached (they are views, in-place or out= ops, or "
                "decompose above autograd). Remove it from the list.");
    impl->names.push_back(name);
  }
  return Policy(std::move(impl));
}

Policy Policy::from_fn(Fn fn) {
  TORCH_CHECK(static_cast<bool>(fn),
              "sac: Policy::from_fn got an empty std::function; pass a "
              "callable that returns a sac::CheckpointPolicy or a bool.");
  auto impl = std::make_shared<Impl>();
  impl->fn = std::move(fn);
  return Policy(std::move(impl));
}

Policy Policy::from_fn(BoolFn fn) {
  TORCH_CHECK(static_cast<bool>(fn),
              "sac: Policy::from_fn got an empty std::function; pass a "
              "callable that returns a sac::CheckpointPolicy or a bool.");
  return from_fn(Fn([fn = std::move(fn)](const SelectiveCheckpointContext& ctx,
                                         const c10::OperatorHandle& op,
                                         c10::ArrayRef<c10::IValue> args) {
    return policy_from_bool(fn(ctx, op, args));
  }));
}

bool Policy::decides_about(const c10::OperatorHandle& op) const {
  if (impl_->fn) {
    return policy::is_cacheable(op);
  }
  return std::find(impl_->ops.begin(), impl_->ops.end(), op) != impl_->ops.end();
}

CheckpointPolicy Policy::decide(const SelectiveCheckpointContext& ctx,
                                const c10::OperatorHandle& op,
                                c10::ArrayRef<c10::IValue> args) const {
  if (impl_->fn) {
    return impl_->fn(ctx, op, args);
  }
  for (const auto& saved : impl_->ops) {
    if (saved == op) {
      return CheckpointPolicy::MustSave;
    }
  }
  return CheckpointPolicy::PreferRecompute;
}

void Policy::prepare_interception() const {
  if (impl_->fn) {
    dispatch::intercept_ops_matching(&policy::is_cacheable);
  } else {
    dispatch::intercept_ops(impl_->ops);
  }
}

const std::vector<c10::OperatorHandle>& Policy::saved_ops() const {
  return impl_->ops;
}

std::string Policy::describe() const {
  if (impl_->fn) {
    return "callback";
  }
  std::string out = "save_ops(";
  for (size_t i = 0; i < impl_->names.size(); ++i) {
    out += (i == 0 ? "" : ", ") + impl_->names[i];
  }
  return out + ")";
}

}  // namespace sac
