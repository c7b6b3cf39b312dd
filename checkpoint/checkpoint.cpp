#include <sac/checkpoint/checkpoint.h>

#include <sac/checkpoint/frame.h>

namespace sac::detail {
namespace {

RegionContexts contexts_for(const CheckpointOptions& options) {
  const bool selective_options =
      options.allow_cache_entry_mutation().has_value() ||
      options.recompute_decisions().has_value();
  if (options.policy().has_value()) {
    TORCH_CHECK(!options.context_fn(),
                "sac::checkpoint: both a policy and a context_fn were given. "
                "A policy is short for a context_fn; pass one of them (put the "
                "policy into create_selective_checkpoint_contexts inside your "
                "context_fn to combine them).");
    return create_selective_checkpoint_contexts(
        *options.policy(), options.allow_cache_entry_mutation().value_or(false),
        options.recompute_decisions().value_or(RecomputeDecisions::ReplayForward));
  }
  TORCH_CHECK(!selective_options,
              "sac::checkpoint: allow_cache_entry_mutation and "
              "recompute_decisions apply to selective checkpointing, but no "
              "policy was given. Add .policy(...), or drop those options (with "
              "a context_fn, pass them to create_selective_checkpoint_contexts).");
  if (options.context_fn()) {
    return options.context_fn()();
  }
  return {};
}

}  // namespace

// The frame and what is active during its forward. Declared in entry order:
// destroying it exits them in reverse.
struct CheckpointedCall::Active {
  std::shared_ptr<CheckpointFrame> frame;
  std::optional<SavedTensorHooksGuard> hooks;
  std::optional<dispatch::ObserverGuard> watch;
  std::optional<ContextScope> context;
  std::optional<OpLogScope> log;
};

CheckpointedCall::CheckpointedCall(const CheckpointOptions& options,
                                   const std::vector<at::Tensor>& inputs,
                                   RecomputeFn recompute)
    : active_(std::make_unique<Active>()) {
  install_hooking_engine();
  FrameConfig config;
  config.early_stop = early_stop_override().value_or(options.early_stop());
  config.debug = debug_override().value_or(options.debug());
  config.debug_backtraces = options.debug_backtraces();
  config.determinism_check =
      options.determinism_check() == DeterminismCheck::Default;
  config.outside_tensor_check = options.outside_tensor_check();
  auto frame = std::make_shared<CheckpointFrame>(
      config, std::move(recompute), contexts_for(options),
      ForwardState::capture(inputs, options.preserve_rng_state()));
  frame->save_inputs(inputs);
  active_->hooks.emplace(frame->forward_hooks());
  if (auto* observer = frame->forward_observer()) {
    active_->watch.emplace(observer);
  }
  active_->context.emplace(frame->forward_context());
  frame->mark_forward_entered();
  if (config.debug) {
    active_->log.emplace(frame->forward_log(), config.debug_backtraces);
  }
  active_->frame = std::move(frame);
}

CheckpointedCall::~CheckpointedCall() = default;

void CheckpointedCall::forward_completed() {
  auto frame = std::move(active_->frame);
  active_.reset();  // exits the forward: log, context, hooks
  frame->mark_forward_completed();
}

}  // namespace sac::detail
