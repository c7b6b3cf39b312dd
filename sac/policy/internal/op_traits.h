// Note [Cacheable ops]
//
// Which ops selective checkpointing may cache at all, from what sac
// believes each op does (sac/dispatch/internal/op_facts.h, included here).
//
// These rules hold for every policy and every dispatch mechanism, so that an
// op-list policy is validated once, when it is built, and the forward and the
// recomputation always agree on which op calls a policy decides about.
#pragma once

#include <sac/dispatch/internal/op_facts.h>

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

// Ops whose schema says "functional" but whose output shares its input's
// storage with a version counter of its own (aten::_unsafe_view). A cache
// must see them to notice in-place changes made through their outputs.
const std::vector<c10::OperatorHandle>& hidden_alias_ops();

}  // namespace sac::detail
