#include <sac/checkpoint/checkpoint.h>

#include <sac/checkpoint/internal/forward_scope.h>
#include <sac/checkpoint/internal/function_rerun.h>
#include <sac/base/internal/region_events.h>

#include <c10/core/GradMode.h>

namespace sac::detail {

bool runs_plainly(const CheckpointOptions& options) {
  return !c10::GradMode::is_enabled() ||
         (options.policy().has_value() && !options.policy()->checkpoints()) ||
         regions_run_plainly();
}

struct RegionForward::Active {
  std::optional<ForwardScope> forward;
};

RegionForward::RegionForward(const CheckpointOptions& options,
                             const std::vector<at::Tensor>& inputs, RecomputeFn recompute)
    : active_(std::make_unique<Active>()) {
  install_hooking_engine();
  const FrameConfig config = frame_config(options);
  auto rerun =
      std::make_shared<FunctionRerun>(std::move(recompute), options.outside_tensor_check());
  rerun->save_inputs(inputs);
  auto frame = std::make_shared<CheckpointFrame>(
      config, rerun, contexts_for(options),
      ForwardState::capture(inputs, options.preserve_rng_state()));
  active_->forward.emplace("sac::checkpoint", std::move(frame), config,
                           [&rerun] { return rerun->forward_observer(); });
}

RegionForward::~RegionForward() = default;

void RegionForward::forward_completed() {
  auto frame = active_->forward->frame();
  active_.reset();  // exits the forward
  frame->mark_forward_completed();
}

}  // namespace sac::detail
