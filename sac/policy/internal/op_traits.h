// Note [Cacheable ops]
//
// Which ops selective checkpointing may cache at all.
//
// These rules hold for every policy and every dispatch mechanism, so that an
// op-list policy is validated once, when it is built, and the forward and the
// recomputation always agree on which op calls a policy decides about.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <string>
#include <vector>

namespace sac::detail {

// Why sac never caches `op`'s outputs, or nullopt if it may. Never cached:
//   * the ops PyTorch's SAC ignores (aten::detach, prim::device and the
//     tensor metadata ops such as aten::size): checkpointing itself calls
//     them a different number of times in forward and recomputation;
//   * views and ops that mutate an input (in-place, out=): their outputs alias
//     their inputs, so a cached value would not be what the recomputation's
//     aliasing expects; they are always recomputed;
//   * CompositeImplicitAutograd ops (aten::linear, aten::dropout, ...): they
//     decompose above autograd and never reach sac; their parts do.
std::optional<std::string> why_never_cached(const c10::OperatorHandle& op);

// Fast form of `!why_never_cached(op)`, for the per-op hot path. Results are
// memoized per thread.
bool is_cacheable(const c10::OperatorHandle& op);

// True for ops PyTorch's SAC ignores (see above): no policy is ever asked
// about them.
bool is_ignored(const c10::OperatorHandle& op);

// True for ops whose output aliases an input without writing it (views).
bool is_view(const c10::OperatorHandle& op);

// True for ops that return fresh memory they do not write (aten::empty and
// its kin): what such a storage holds came through its data pointer
// (torch::tensor fills one from the host) unless an op wrote it later.
bool makes_uninitialized_memory(const c10::OperatorHandle& op);

// True for ops that draw from a random generator (tag nondeterministic_seeded).
bool is_random(const c10::OperatorHandle& op);

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

// Ops whose schema says "functional" but whose output shares its input's
// storage with a version counter of its own (aten::_unsafe_view). A cache
// must see them to notice in-place changes made through their outputs.
const std::vector<c10::OperatorHandle>& hidden_alias_ops();

}  // namespace sac::detail
