#include <sac/checkpoint/internal/frame_setup.h>

#include <sac/cache/selective_modes.h>
#include <sac/checkpoint/guards.h>

namespace sac::detail {

FrameConfig frame_config(const CheckpointOptions& options) {
  FrameConfig config;
  config.early_stop = early_stop_override().value_or(options.early_stop());
  config.debug = debug_override().value_or(options.debug());
  config.debug_backtraces = options.debug_backtraces();
  const DeterminismCheck check = determinism_check_override().value_or(options.determinism_check());
  config.determinism_check = check != DeterminismCheck::None;
  config.value_check = check == DeterminismCheck::Values;
  config.name = options.name();
  config.preserve_rng_state = options.preserve_rng_state();
  return config;
}

RegionContexts contexts_for(const CheckpointOptions& options) {
  const bool selective_options = options.allow_cache_entry_mutation().has_value() ||
                                 options.offload_to() != nullptr || options.statistics() != nullptr;
  if (options.policy().has_value()) {
    TORCH_CHECK(!options.context_fn(),
                "sac: both a policy and a context_fn were given. "
                "A policy is short for a context_fn; pass one of them (put the "
                "policy into create_selective_checkpoint_contexts inside your "
                "context_fn to combine them).");
    return create_selective_checkpoint_contexts(
        *options.policy(), options.allow_cache_entry_mutation().value_or(false),
        options.offload_to(), options.statistics());
  }
  TORCH_CHECK(!selective_options,
              "sac: allow_cache_entry_mutation, offload_to and statistics apply "
              "to selective checkpointing, but no policy was given. Add "
              ".policy(...) (to count a full recomputation, "
              ".policy(sac::nothing_saveable())), or drop those options (with a "
              "context_fn, pass them to create_selective_checkpoint_contexts).");
  if (options.context_fn()) {
    return options.context_fn()();
  }
  return {};
}

}  // namespace sac::detail
