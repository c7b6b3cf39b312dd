// The state of one checkpointed region: PyTorch's _CheckpointFrame.
//
// During the forward, each tensor autograd saves is replaced by a *holder*
// (forward hooks). The first unpack of a holder in a backward pass recomputes
// the region under the recompute context, with the forward's RNG and autocast
// state; the recomputation (recomputation.h: the function run again, or the
// recorded ops replayed) fills the holders in the order the forward packed
// them, and stops early once all are filled. Each backward pass (graph task)
// recomputes once.
//
// The frame is owned by the hooks in the autograd graph: when the graph is
// freed, after backward or when dropped, the frame and everything it keeps
// (the contexts and their cache, the saved inputs) go with it.
#pragma once

#include <sac/base/context.h>
#include <sac/base/internal/region_events.h>
#include <sac/base/internal/saved_tensor_hooks.h>
#include <sac/check/internal/debug_log.h>
#include <sac/checkpoint/internal/device_state.h>
#include <sac/checkpoint/internal/recomputation.h>
#include <sac/check/internal/checksum.h>
#include <sac/check/internal/op_origins.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace sac::detail {

struct FrameConfig {
  // What the user called, as the frame's errors begin: "sac::checkpoint" or
  // "sac::CheckpointRegion".
  const char* api = "sac::checkpoint";
  bool early_stop = true;
  bool determinism_check = true;
  bool value_check = false;  // DeterminismCheck::Values
  bool preserve_rng_state = true;
  std::string name;  // CheckpointOptions::name
  bool debug = false;
  bool debug_backtraces = false;
};

struct Holder;

class CheckpointFrame : public std::enable_shared_from_this<CheckpointFrame> {
 public:
  CheckpointFrame(FrameConfig config, std::shared_ptr<Recomputation> recomputation,
                  RegionContexts contexts, ForwardState forward_state);
  // Releases the contexts (RegionContext::release), if the forward ran under
  // them, and the recomputation.
  ~CheckpointFrame();

  // Hooks for the tensors the forward saves.
  SavedTensorHooksFactory forward_hooks();

  RegionContext* forward_context() const { return contexts_.forward.get(); }
  // The forward context was entered: from now on the contexts hold state for
  // this region, which the frame releases when it dies.
  void mark_forward_entered() {
    forward_entered_ = true;
    if (RegionEvents* events = region_events()) {
      events->forward_began(this);
    }
  }
  OpLog& forward_log() { return forward_log_; }
  // What made the tensors the forward saves, noted with the value check on.
  OpOrigins& origins() { return origins_; }
  const FrameConfig& config() const { return config_; }
  void mark_forward_completed() {
    forward_completed_ = true;
    note_written_outside_tensors(/*forward_ended=*/true);
    if (RegionEvents* events = region_events()) {
      events->forward_ended(this);
    }
  }
  // The forward ended by an exception: its saved tensors cannot be
  // recomputed, and what the recomputation kept is released now.
  void abandon();

  // ---- Called by the hooks ------------------------------------------------
  std::shared_ptr<Holder> add_holder(const at::Tensor& packed);
  at::Tensor unpack(Holder& holder);
  void save_recomputed(int64_t graph_task, const at::Tensor& value);

 private:
  struct TensorMetadata {
    std::vector<int64_t> sizes;
    c10::ScalarType dtype;
    c10::Device device;
    bool operator==(const TensorMetadata& other) const {
      return sizes == other.sizes && dtype == other.dtype && device == other.device;
    }
    std::string str() const;
  };
  struct PassState {
    size_t saved = 0;         // tensors saved by this pass's recomputation
    bool recomputed = false;  // recomputation ran (and was checked)
    // The value check's checksums on an accelerator, by holder: compared
    // together when the recomputation ends (one synchronization).
    std::vector<std::pair<size_t, ValueChecksum>> unchecked;
  };

  at::Tensor unpack_unchecked(Holder& holder);
  // Releases the recomputation and the contexts, once.
  void release();
  void recompute(int64_t graph_task);
  void check_recomputed_tensors_match(int64_t graph_task);
  // The value check: the recomputation saved `value` as the `index`th tensor.
  // Checksums on an accelerator wait in `pass` for check_unchecked_values.
  void check_value(size_t index, const at::Tensor& value, PassState& pass) const;
  void check_unchecked_values(PassState& pass) const;
  [[noreturn]] void value_differs(size_t index, const std::string& what) const;
  // "region `name`", or how to name it.
  std::string region_name() const;
  [[noreturn]] void rethrow_with_logs(const c10::Error& error) const;

  FrameConfig config_;
  std::shared_ptr<Recomputation> recomputation_;
  RegionContexts contexts_;
  ForwardState forward_state_;
  std::vector<std::weak_ptr<Holder>> holders_;
  std::vector<TensorMetadata> metadata_;  // one per holder, with the check on
  struct SavedValue {
    ValueChecksum checksum;
    // Note [Written by the region]: the region itself wrote it after saving
    // it, so the recomputation saves other values, rightly. Known at the
    // forward's end, or earlier when a backward inside the forward
    // recomputes: from then on, as the recomputation then runs after the
    // writes it would otherwise blame. A batch norm's running statistics
    // (SavedOrigin::state) are so from the start: every batch norm that
    // runs updates them, in this region or another one's recomputation, and
    // their schema does not say so.
    bool written_by_region = false;
    // The outside tensor, until the forward ends (weak: the region's graph,
    // which owns the frame, may hang from it).
    std::optional<c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>> outside;
    // Its version when saved. A recomputation that saves an outside tensor
    // at another version saw a change the version counters see: the
    // outside-tensor check and autograd judge those; the value check is for
    // the changes they cannot see.
    uint32_t version = 0;
  };
  // Which outside tensors the region has written: at the forward's end, and
  // before a recomputation inside the forward.
  void note_written_outside_tensors(bool forward_ended);
  std::vector<SavedValue> values_;  // one per holder, with the value check on
  OpOrigins origins_;
  std::unordered_map<int64_t, PassState> passes_;
  bool forward_entered_ = false;
  bool forward_completed_ = false;
  bool abandoned_ = false;
  bool released_ = false;
  OpLog forward_log_;
  OpLog recompute_log_;
};

}  // namespace sac::detail
