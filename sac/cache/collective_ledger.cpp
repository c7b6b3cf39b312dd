#include <sac/cache/internal/collective_ledger.h>

#include <sac/base/internal/check.h>
#include <sac/policy/internal/op_traits.h>

#include <c10/util/Exception.h>

namespace sac::detail {
void CollectiveLedger::note(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  calls_[op].push_back(detail::collective_signature(args));
}

size_t CollectiveLedger::size() const {
  size_t calls = 0;
  for (const auto& [op, signatures] : calls_) {
    calls += signatures.size();
  }
  return calls;
}

void CollectiveLedger::check(const c10::OperatorHandle& op, size_t call_index,
                             c10::ArrayRef<c10::IValue> args) const {
  const auto found = calls_.find(op);
  const size_t forward_calls = found == calls_.end() ? 0 : found->second.size();
  SAC_CHECKPOINT_CHECK(
      call_index < forward_calls,
      "sac: the recomputation of a checkpointed region would issue collective ", op.operator_name(),
      " (", detail::collective_signature(args), ") as its call ", call_index + 1,
      ", but the region's forward issued ", forward_calls,
      " such calls. sac does not issue it: the other ranks would not join it (a hang, "
      "or a silent mismatch with their next collective). The region's function must "
      "issue the same collectives when it runs again: make it depend only on its "
      "inputs, or keep the collective's output with a policy "
      "(sac::never_recompute_collectives()).");
  const std::string now = detail::collective_signature(args);
  SAC_CHECKPOINT_CHECK(
      now == found->second[call_index],
      "sac: the recomputation of a checkpointed region would issue collective ", op.operator_name(),
      " with (", now, ") as its call ", call_index + 1, ", but the forward issued it with (",
      found->second[call_index],
      "). sac does not issue it: the other ranks would run a different collective. "
      "The region's function must issue the same collectives when it runs again: make "
      "it depend only on its inputs, or keep the collective's output with a policy "
      "(sac::never_recompute_collectives()).");
}

void CollectiveLedger::clear() { calls_.clear(); }

}  // namespace sac::detail
