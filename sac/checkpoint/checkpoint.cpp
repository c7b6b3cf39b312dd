#include <sac/checkpoint/checkpoint.h>

#include <sac/checkpoint/internal/frame.h>
#include <sac/checkpoint/internal/frame_setup.h>
#include <sac/checkpoint/internal/function_rerun.h>
#include <sac/checkpoint/internal/profiler_scope.h>

namespace sac::detail {
// The frame and what is active during its forward. Declared in entry order:
// destroying it exits them in reverse.
struct CheckpointedCall::Active {
  // "sac::checkpoint" in the PyTorch profiler, around the whole forward.
  ProfilerScope scope{"sac::checkpoint"};
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
  const FrameConfig config = frame_config(options);
  auto rerun = std::make_shared<FunctionRerun>(std::move(recompute),
                                               options.outside_tensor_check());
  rerun->save_inputs(inputs);
  auto frame = std::make_shared<CheckpointFrame>(
      config, rerun, contexts_for(options),
      ForwardState::capture(inputs, options.preserve_rng_state()));
  active_->hooks.emplace(frame->forward_hooks());
  if (auto* observer = rerun->forward_observer()) {
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
