// Note [The collective ledger]
//
// The collectives a checkpointed region's forward issued, in order, so that
// its recomputation can only re-issue the same ones.
//
// A collective run again in recomputation communicates again: every rank
// must re-issue the same collectives, in the same order, or the ranks hang
// or (worse) pair one rank's recomputed all-gather with another's next
// collective, silently. Recomputation runs the forward's ops again, and every
// rank's backward walks the same graph, so the ranks agree as long as each
// rank's recomputation issues what its forward issued. The ledger checks
// exactly that, per call, *before* the collective is issued: a region whose
// recomputation would issue a collective the forward did not (a different
// op, group, reduction, shape or dtype, or one call too many) fails with an
// error on that rank instead of communicating.
//
// It knows the functional collectives (sac/policy/internal/op_traits.h,
// issues_collective): calls made on a ProcessGroup object directly are not
// dispatcher ops sac can intercept under every mechanism.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <string>
#include <unordered_map>
#include <vector>

namespace sac::detail {

class CollectiveLedger {
 public:
  // Forward: notes the call of collective `op` with `args`, about to run.
  void note(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args);

  // Recomputation: `args` for the `call_index`-th call of `op` (0-based, counted
  // from the pass's start) must be what the forward's call of that index
  // had. Throws a c10::Error that names both otherwise.
  void check(const c10::OperatorHandle& op, size_t call_index,
             c10::ArrayRef<c10::IValue> args) const;

  // Calls noted.
  size_t size() const;
  void clear();

 private:
  // Each op's calls, in order: what makes them the same communication.
  std::unordered_map<c10::OperatorHandle, std::vector<std::string>> calls_;
};

}  // namespace sac::detail
