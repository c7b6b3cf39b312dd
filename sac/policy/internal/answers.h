// Questions about a CheckpointPolicy answer that sac's floors ask: which of
// save, recompute and offload it is, whether it must win, and PyTorch's
// mapping of a bool answer.
#pragma once

#include <sac/policy/checkpoint_policy.h>

namespace sac::detail {

constexpr bool is_save(CheckpointPolicy policy) {
  return policy == CheckpointPolicy::MustSave || policy == CheckpointPolicy::PreferSave;
}

constexpr bool is_recompute(CheckpointPolicy policy) {
  return policy == CheckpointPolicy::MustRecompute || policy == CheckpointPolicy::PreferRecompute;
}

constexpr bool is_offload(CheckpointPolicy policy) {
  return policy == CheckpointPolicy::MustCpuOffload || policy == CheckpointPolicy::PreferCpuOffload;
}

// Save or offload: the outputs are kept somewhere until backward.
constexpr bool is_kept(CheckpointPolicy policy) { return !is_recompute(policy); }

constexpr bool is_must(CheckpointPolicy policy) {
  return policy == CheckpointPolicy::MustSave || policy == CheckpointPolicy::MustRecompute ||
         policy == CheckpointPolicy::MustCpuOffload;
}

// A bool-returning policy's answer: true saves (MustSave), false recomputes
// (PreferRecompute), as PyTorch maps it.
constexpr CheckpointPolicy policy_from_bool(bool save) {
  return save ? CheckpointPolicy::MustSave : CheckpointPolicy::PreferRecompute;
}

}  // namespace sac::detail
