#include <sac/cache/internal/collective_ledger.h>

#include <sac/base/internal/check.h>

#include <c10/util/Exception.h>

#include <sstream>

namespace sac {
namespace {

// What makes two calls of a collective the same communication: its tensors'
// dtypes and shapes, and its other arguments (group name, reduction, group
// size), in schema order.
std::string signature(c10::ArrayRef<c10::IValue> args) {
  const auto describe = [](const at::Tensor& t) {
    return t.defined() ? c10::str(t.scalar_type(), t.sizes()) : std::string("undefined");
  };
  std::ostringstream out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (i > 0) {
      out << ", ";
    }
    const c10::IValue& arg = args[i];
    if (arg.isTensor()) {
      out << describe(arg.toTensor());
    } else if (arg.isTensorList()) {
      out << "[";
      for (const at::Tensor& t : arg.toTensorVector()) {
        out << describe(t) << " ";
      }
      out << "]";
    } else if (arg.isString()) {
      out << arg.toStringRef();
    } else {
      out << arg;
    }
  }
  return out.str();
}

}  // namespace

void CollectiveLedger::note(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  calls_[op].push_back(signature(args));
}

size_t CollectiveLedger::size() const {
  size_t calls = 0;
  for (const auto& [op, signatures] : calls_) {
    calls += signatures.size();
  }
  return calls;
}

void CollectiveLedger::check(const c10::OperatorHandle& op, size_t call,
                             c10::ArrayRef<c10::IValue> args) const {
  const auto found = calls_.find(op);
  const size_t forward_calls = found == calls_.end() ? 0 : found->second.size();
  SAC_CHECKPOINT_CHECK(call < forward_calls,
              "sac: the recomputation of a checkpointed region would issue collective ",
              op.operator_name(), " (", signature(args), ") as its call ", call + 1,
              ", but the region's forward issued ", forward_calls,
              " such calls. sac does not issue it: the other ranks would not join it (a hang, "
              "or a silent mismatch with their next collective). The region's function must "
              "issue the same collectives when it runs again: make it depend only on its "
              "inputs, or keep the collective's output with a policy "
              "(sac::never_recompute_collectives()).");
  const std::string now = signature(args);
  SAC_CHECKPOINT_CHECK(now == found->second[call],
              "sac: the recomputation of a checkpointed region would issue collective ",
              op.operator_name(), " with (", now, ") as its call ", call + 1,
              ", but the forward issued it with (", found->second[call],
              "). sac does not issue it: the other ranks would run a different collective. "
              "The region's function must issue the same collectives when it runs again: make "
              "it depend only on its inputs, or keep the collective's output with a policy "
              "(sac::never_recompute_collectives()).");
}

void CollectiveLedger::clear() { calls_.clear(); }

}  // namespace sac
