// What is active while a region's forward runs, for sac::checkpoint and the
// region guard alike: entered in the order below, exited in reverse when the
// scope is destroyed.
#pragma once

#include <sac/base/context.h>
#include <sac/base/internal/saved_tensor_hooks.h>
#include <sac/check/internal/debug_log.h>
#include <sac/checkpoint/internal/frame.h>
#include <sac/checkpoint/internal/frame_setup.h>
#include <sac/check/internal/in_place_reads.h>
#include <sac/checkpoint/internal/profiler_scope.h>
#include <sac/dispatch/internal/interceptor.h>

#include <functional>
#include <memory>
#include <optional>

namespace sac::detail {

class ForwardScope {
 public:
  // The profiler scope `name` (a literal), the frame's saved-tensor hooks,
  // its forward context (a selective region's caching mode), the observer
  // that `observer` makes if any (made once the context is entered: it may
  // ask for the active interceptor; under per-op kernels in-place ops are
  // shown to it too), the op log with debug on, and the saved tensors'
  // origins with the value check.
  ForwardScope(const char* name, std::shared_ptr<CheckpointFrame> frame, const FrameConfig& config,
               const std::function<detail::OpObserver*()>& observer)
      : profiler_(name), frame_(std::move(frame)) {
    hooks_.emplace(frame_->forward_hooks());
    context_.emplace(frame_->forward_context());
    frame_->mark_forward_entered();
    if (detail::OpObserver* made = observer ? observer() : nullptr) {
      observer_.emplace(made);
      in_place_reads_.emplace(made);
    }
    if (config.debug) {
      log_.emplace(frame_->forward_log(), config.debug_backtraces);
    }
    if (config.value_check) {
      origins_.emplace(frame_->origins());
    }
  }
  ForwardScope(const ForwardScope&) = delete;
  ForwardScope& operator=(const ForwardScope&) = delete;

  const std::shared_ptr<CheckpointFrame>& frame() const { return frame_; }

 private:
  ProfilerScope profiler_;
  std::shared_ptr<CheckpointFrame> frame_;
  std::optional<SavedTensorHooksGuard> hooks_;
  std::optional<RegionContext::Scope> context_;
  std::optional<detail::ObserverGuard> observer_;
  std::optional<InPlaceReadsScope> in_place_reads_;
  std::optional<OpLogScope> log_;
  std::optional<OriginScope> origins_;
};

}  // namespace sac::detail
