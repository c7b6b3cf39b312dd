// Note [What sac believes an op does]
//
// What an op call reads, writes, aliases, draws and communicates, as sac's
// floors ask it: the schema where it says so, and the ops whose schemas do
// not say it all (the legacy batch norms' running statistics, c10d's ops on
// a ProcessGroup, FSDP2's all_gather_copy_in), in one place. The caching
// rules built on these facts are policy/internal/op_traits.h's.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <cstddef>
#include <string>

namespace sac::detail {

// ---- Writes and reads -------------------------------------------------------

// Whether `op`, called with `args`, writes its argument `index`: in-place
// and out= arguments and others its schema marks written (Tensor(a!)), and
// the running statistics of the legacy batch-norm ops (native_batch_norm,
// cudnn_batch_norm, miopen_batch_norm), which write them in training
// without saying so in their schema.
bool writes_argument(const c10::OperatorHandle& op, size_t index, c10::ArrayRef<c10::IValue> args);

// writes_argument, and the writes no schema declares: c10d's ops on a
// ProcessGroup write their output arguments (and allreduce_'s `tensors`);
// fsdp::all_gather_copy_in writes its all_gather_output.
bool writes_argument_declared_or_not(const c10::OperatorHandle& op, size_t index,
                                     c10::ArrayRef<c10::IValue> args);

// Whether `op` writes its argument `index` without reading what it held: an
// out= argument, or the `self` of an in-place op whose result does not
// depend on it (copy_, fill_, zero_, and the random fills: bernoulli_,
// uniform_, normal_, ...).
bool overwrites_argument(const c10::OperatorHandle& op, size_t index);

// Whether `op` reads what argument `index` holds. A view reads nothing
// (until something reads the view); an out= argument is only written; an
// in-place op reads its `self` unless it overwrites it whole; an undeclared
// write (above) reads unless it writes the argument whole.
bool reads_argument(const c10::OperatorHandle& op, size_t index);

// Whether `op`'s schema marks any argument written (in-place, out=).
bool declares_a_write(const c10::OperatorHandle& op);

// ---- Aliases and memory -----------------------------------------------------

// True for ops whose output aliases an input without writing it (views).
bool is_view(const c10::OperatorHandle& op);

// True for ops whose every output aliases an input, none written: they make
// no values, so they read none (until something reads the view). Inline:
// the outside-tensor watch asks it of every op.
inline bool only_aliases(const c10::OperatorHandle& op) {
  const auto& returns = op.schema().returns();
  for (const auto& ret : returns) {
    if (ret.alias_info() == nullptr || ret.alias_info()->isWrite()) {
      return false;
    }
  }
  return !returns.empty();
}

// True for ops that return fresh memory they do not write (aten::empty and
// its kin): what such a storage holds came through its data pointer
// (torch::tensor fills one from the host) unless an op wrote it later.
bool makes_uninitialized_memory(const c10::OperatorHandle& op);

// ---- Random draws -----------------------------------------------------------

// True for ops that draw from a random generator (tag nondeterministic_seeded).
bool is_random(const c10::OperatorHandle& op);

// ---- Communication ----------------------------------------------------------

// True for c10d's collectives (c10d::, _c10d_functional:: and
// _c10d_functional_autograd::): running one again communicates again.
bool is_collective(const c10::OperatorHandle& op);

// True for the functional collectives that communicate: every op of
// _c10d_functional and _c10d_functional_autograd except wait_tensor, which
// only waits for one. These are the collectives a checkpointed region tracks
// (sac/cache/internal/collective_ledger.h). Cheap for aten ops: one character compare.
bool issues_collective(const c10::OperatorHandle& op);

// True for the collectives that communicate: issues_collective's, and c10d's
// ops on a ProcessGroup (c10d::_allgather_base_, c10d::broadcast_, ...),
// which a region records (sac/record/internal/communication.h).
bool communicates(const c10::OperatorHandle& op);

// What makes two calls of a collective the same communication: its tensors'
// dtypes and shapes, and its other arguments (group, reduction, group size),
// in schema order, as text.
std::string collective_signature(c10::ArrayRef<c10::IValue> args);

}  // namespace sac::detail
