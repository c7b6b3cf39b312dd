#include <sac/checkpoint/checkpoint.h>

#include <sac/checkpoint/internal/forward_scope.h>
#include <sac/checkpoint/internal/function_rerun.h>
#include <sac/base/internal/region_events.h>

#include <c10/core/GradMode.h>

#include <unordered_set>
#include <utility>
#include <vector>

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
  // A listener hears which inputs the frame holds, and how many handles on
  // each are the frame's: those that saving them added.
  RegionEvents* events = region_events();
  std::vector<std::pair<const at::Tensor*, int64_t>> held;
  if (events != nullptr) {
    std::unordered_set<const c10::TensorImpl*> seen;
    for (const at::Tensor& input : inputs) {
      if (input.defined() && seen.insert(input.unsafeGetTensorImpl()).second) {
        held.emplace_back(&input, static_cast<int64_t>(input.use_count()));
      }
    }
  }
  rerun->save_inputs(inputs);
  for (auto& [input, handles] : held) {
    handles = static_cast<int64_t>(input->use_count()) - handles;
  }
  auto frame = std::make_shared<CheckpointFrame>(
      config, rerun, contexts_for(options),
      ForwardState::capture(inputs, options.preserve_rng_state()));
  const CheckpointFrame* region = frame.get();
  active_->forward.emplace("sac::checkpoint", std::move(frame), config,
                           [&rerun] { return rerun->forward_observer(); });
  if (events != nullptr) {
    for (const auto& [input, handles] : held) {
      events->input_held(region, *input, handles);
    }
    events->heard_whole(region);
  }
}

RegionForward::~RegionForward() = default;

void RegionForward::forward_completed() {
  auto frame = active_->forward->frame();
  active_.reset();  // exits the forward
  frame->mark_forward_completed();
}

}  // namespace sac::detail
