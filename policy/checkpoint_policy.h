// The per-op decision of selective activation checkpointing.
#pragma once

#include <string_view>

namespace sac {

// What to do with an op's outputs in a checkpointed region: keep them for the
// backward pass (save) or compute them again there (recompute). `Must*` and
// `Prefer*` act alike in eager mode; the distinction tells other systems
// (such as compilers) whether the choice may be overridden, as in PyTorch.
enum class CheckpointPolicy {
  MustSave,
  PreferSave,
  MustRecompute,
  PreferRecompute,
};

// True for MustSave and PreferSave.
constexpr bool is_save(CheckpointPolicy policy) {
  return policy == CheckpointPolicy::MustSave ||
         policy == CheckpointPolicy::PreferSave;
}

// A bool-returning policy's answer: true saves (MustSave), false recomputes
// (PreferRecompute), as PyTorch maps it.
constexpr CheckpointPolicy policy_from_bool(bool save) {
  return save ? CheckpointPolicy::MustSave : CheckpointPolicy::PreferRecompute;
}

std::string_view to_string(CheckpointPolicy policy);

// What a policy callback is told about the call it decides on.
struct SelectiveCheckpointContext {
  // False in the original forward. True only when the policy is asked again
  // during recomputation (see `ask_policy_on_recompute`); by default the
  // forward's decisions are replayed and the policy is not asked.
  bool is_recompute = false;
};

}  // namespace sac
