#include <sac/checkpoint/region.h>

#include <sac/base/internal/check.h>
#include <sac/checkpoint/checkpoint.h>
#include <sac/checkpoint/internal/forward_scope.h>
#include <sac/checkpoint/internal/frame_setup.h>
#include <sac/check/internal/read_watch.h>
#include <sac/checkpoint/scope.h>
#include <sac/dispatch/internal/interceptor.h>
#include <sac/record/internal/recorder.h>
#include <sac/record/internal/replay.h>

#include <c10/util/ScopeExit.h>

#include <exception>
#include <optional>
#include <unordered_map>

namespace sac {
namespace detail {

// Recomputation by replaying what the region recorded.
class RegionReplay final : public Recomputation {
 public:
  // `statistics` (or null) counts the replays' agreements with other ranks.
  explicit RegionReplay(std::shared_ptr<RegionStatistics> statistics)
      : statistics_(std::move(statistics)) {}

  // The region began; `region_interceptor` is its interceptor (or null).
  detail::OpObserver* start_recording(const detail::OpInterceptor* region_interceptor) {
    recorder_.emplace(recording_, region_interceptor, [this](const at::Tensor& t) {
      // A tensor an enclosing region overwrites is watched by its bytes too
      // (Note [Rewritten by a recomputation]); the recorder appends the
      // outside tensor it saves next.
      if (ReadWatch watch(t); watch.watches_bytes()) {
        rewritten_.emplace(recording_.outside.size(), Rewritten{std::move(watch), t});
      }
      // The recorder hands over a tensor without a graph (a tensor that a
      // backward inside the region made would keep the region's graph, and
      // so this frame, alive), on the tensor's version counter. Not through
      // an enclosing region's hooks: that region's recomputation would not
      // save what a backward inside this region made in its forward.
      return save_unhooked(t);
    });
    return &*recorder_;
  }

  void finish_recording() { recorder_.reset(); }

  void saved(const at::Tensor& packed) override {
    TORCH_INTERNAL_ASSERT(recorder_.has_value(), "sac: a region saved a tensor after it ended");
    recorder_->mark(packed);
  }

  std::unique_ptr<Pass> begin(CheckpointFrame& frame, int64_t graph_task) override {
    // Checked here, not by whoever keeps the tensors: a copy target's hooks
    // watch a copy, and a view read on outside memory is kept as part of
    // its whole storage.
    for (const detail::OutsideRead& read : recording_.outside_reads) {
      const auto rewritten = rewritten_.find(read.outside);
      SAC_CHECKPOINT_CHECK(recording_.outside[read.outside].snapshot.has_value() ||
                               recording_.outside[read.outside].fresh || !read.version.changed() ||
                               (rewritten != rewritten_.end() &&
                                !rewritten->second.watch.changed()),
                           "sac::CheckpointRegion: a tensor the region read but did not make "
                           "(shape ",
                           c10::IntArrayRef(read.sizes),
                           ": a parameter, a buffer, a "
                           "tensor made before the region) was modified in place after the "
                           "region read it (version ",
                           read.version.version(), " when read, ", read.version.current_version(),
                           " now); the replay would read the "
                           "modified value. The region keeps such tensors as autograd keeps the "
                           "inputs it saves: do not modify them in place between the region and "
                           "backward (modify a clone, or run the backward first).");
    }
    std::vector<at::Tensor> outside(recording_.outside.size());
    for (size_t i = 0; i < recording_.outside.size(); ++i) {
      const detail::Outside& kept = recording_.outside[i];
      if (kept.snapshot.has_value() || kept.fresh) {
        continue;
      }
      if (const auto rewritten = rewritten_.find(i); rewritten != rewritten_.end()) {
        outside[i] = rewritten->second.tensor;  // its bytes were checked above
        continue;
      }
      try {
        outside[i] = kept.saved.unpack();
      } catch (const c10::Error& error) {
        SAC_CHECKPOINT_CHECK(false,
                             "sac::CheckpointRegion: a tensor the region read but did "
                             "not make (shape ",
                             c10::IntArrayRef(kept.sizes),
                             ": a parameter, "
                             "a buffer, a tensor made before the region) cannot be given to "
                             "its replay: ",
                             error.what_without_backtrace());
      }
    }
    return std::make_unique<ReplayPass>(recording_, std::move(outside), frame.weak_from_this(),
                                        graph_task, statistics_.get());
  }

  void release() override {
    recorder_.reset();
    recording_.clear();
    rewritten_.clear();
  }

 private:
  class ReplayPass final : public Pass {
   public:
    ReplayPass(const detail::Recording& recording, std::vector<at::Tensor> outside,
               std::weak_ptr<CheckpointFrame> frame, int64_t graph_task,
               RegionStatistics* statistics)
        : recording_(recording),
          outside_(std::move(outside)),
          frame_(std::move(frame)),
          graph_task_(graph_task),
          statistics_(statistics) {}

    void run() override {
      auto frame = frame_.lock();
      TORCH_INTERNAL_ASSERT(frame, "sac: checkpoint frame freed during its replay");
      RegionStatistics::Counts counts;
      // Counted whether the replay ends or stops early (an exception).
      const auto count = c10::make_scope_exit([&] {
        if (statistics_ != nullptr && counts.agreements > 0) {
          statistics_->add(counts);
        }
      });
      detail::replay(
          recording_, std::move(outside_),
          [&](size_t, const at::Tensor& value) {
            frame->save_recomputed(graph_task_,
                                   value.requires_grad() ? value.tensor_data() : value);
          },
          &counts.agreements);
    }

   private:
    const detail::Recording& recording_;
    std::vector<at::Tensor> outside_;
    std::weak_ptr<CheckpointFrame> frame_;
    int64_t graph_task_;
    RegionStatistics* statistics_;
  };

  detail::Recording recording_;
  // Outside tensors an enclosing region overwrites, by index in the
  // recording: kept as they are (alive as the region's buffers are), and
  // given to the replay while their bytes are the ones read.
  struct Rewritten {
    ReadWatch watch;
    at::Tensor tensor;
  };
  std::unordered_map<size_t, Rewritten> rewritten_;
  std::optional<detail::Recorder> recorder_;
  std::shared_ptr<RegionStatistics> statistics_;
};

}  // namespace detail

struct CheckpointRegion::Active {
  int exceptions_at_start = std::uncaught_exceptions();
  std::shared_ptr<detail::RegionReplay> replay;
  std::optional<detail::ForwardScope> forward;
};

CheckpointRegion::CheckpointRegion() : CheckpointRegion(detail::scoped_options()) {}

CheckpointRegion::CheckpointRegion(const CheckpointOptions& options) {
  if (detail::runs_plainly(options)) {
    return;
  }
  std::string why;
  SAC_CHECKPOINT_CHECK(detail::observers_see_every_op(&why),
                       "sac::CheckpointRegion records every op of the region below autograd, "
                       "views and in-place ops included, which only sac's fallback-key "
                       "dispatch mechanism sees; but ",
                       why,
                       ". Use sac::checkpoint(fn, "
                       "args...) for this code instead: it works with either mechanism.");
  TORCH_CHECK(options.outside_tensor_check(),
              "sac::CheckpointRegion: outside_tensor_check(false) is not "
              "supported: a region keeps the tensors it reads from outside as "
              "autograd keeps saved inputs, and always checks them. Drop the "
              "option.");
  detail::install_hooking_engine();
  detail::FrameConfig config = detail::frame_config(options);
  config.api = "sac::CheckpointRegion";
  auto active = std::make_unique<Active>();
  active->replay = std::make_shared<detail::RegionReplay>(options.statistics());
  auto frame = std::make_shared<detail::CheckpointFrame>(
      config, active->replay, detail::contexts_for(options),
      detail::ForwardState::capture_current(options.preserve_rng_state()));
  active->forward.emplace("sac::CheckpointRegion", std::move(frame), config,
                          [replay = active->replay] {
                            return replay->start_recording(detail::active_interceptor());
                          });
  active_ = std::move(active);
}

CheckpointRegion::~CheckpointRegion() {
  if (active_) {
    end(std::uncaught_exceptions() > active_->exceptions_at_start);
  }
}

void CheckpointRegion::end(bool threw) {
  auto frame = active_->forward->frame();
  auto replay = std::move(active_->replay);
  active_.reset();  // exits the forward
  replay->finish_recording();
  if (threw) {
    frame->abandon();
  } else {
    frame->mark_forward_completed();
  }
}

namespace detail {

void end_region(CheckpointRegion& region, bool threw) {
  if (region.active_) {
    region.end(threw);
  }
}

}  // namespace detail
}  // namespace sac
