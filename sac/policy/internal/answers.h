// Questions about a CheckpointPolicy answer that sac's floors ask: which of
// save, recompute and offload it is, whether it must win, and PyTorch's
// mapping of a bool answer.
#pragma once

#include <sac/policy/checkpoint_policy.h>

namespace sac::detail {

constexpr bool is_save(CheckpointPolicy answer) {
  return answer == CheckpointPolicy::MustSave || answer == CheckpointPolicy::PreferSave;
}

constexpr bool is_recompute(CheckpointPolicy answer) {
  return answer == CheckpointPolicy::MustRecompute || answer == CheckpointPolicy::PreferRecompute;
}

constexpr bool is_offload(CheckpointPolicy answer) {
  return answer == CheckpointPolicy::MustCpuOffload || answer == CheckpointPolicy::PreferCpuOffload;
}

// Save or offload: the outputs are kept somewhere until backward.
constexpr bool is_kept(CheckpointPolicy answer) { return !is_recompute(answer); }

constexpr bool is_must(CheckpointPolicy answer) {
  return answer == CheckpointPolicy::MustSave || answer == CheckpointPolicy::MustRecompute ||
         answer == CheckpointPolicy::MustCpuOffload;
}

// A bool-returning policy's answer: true saves (MustSave), false recomputes
// (PreferRecompute), as PyTorch maps it.
constexpr CheckpointPolicy policy_from_bool(bool save) {
  return save ? CheckpointPolicy::MustSave : CheckpointPolicy::PreferRecompute;
}

}  // namespace sac::detail
