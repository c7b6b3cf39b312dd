#include <sac/checkpoint/internal/frame.h>

#include <sac/base/internal/check.h>
#include <sac/base/internal/early_stop.h>
#include <sac/base/internal/storage_key.h>
#include <sac/checkpoint/graph_exec_group.h>
#include <sac/checkpoint/internal/profiler_scope.h>
#include <sac/check/internal/read_watch.h>
#include <sac/dispatch/internal/interceptor.h>

#include <ATen/core/grad_mode.h>
#include <c10/util/irange.h>
#include <torch/csrc/autograd/graph_task.h>

#include <atomic>
#include <optional>
#include <sstream>
#include <unordered_set>
#include <utility>

namespace sac::detail {

// One tensor saved in forward: what it is replaced with in the graph.
struct Holder {
  explicit Holder(const at::Tensor& packed)
      : packed_version(packed), unpacked_more_than_once(packed.is_view()) {}
  // Autograd checks a saved tensor's version when it is unpacked, but not
  // when hooks hold it: this restores that check (see check_not_modified).
  ReadWatch packed_version;
  // Note [A view saved by an in-place op is unpacked twice]: autograd saves
  // the output of an in-place op on a view (relu_, exp_ on a select) for a
  // node that a double backward runs twice in one pass: as a node of its
  // own (the unpacked output's grad_fn) and inside the base's CopySlices.
  // The recomputed value of a view stays in its holder, then, for a second
  // unpack; other values are handed over, and freed with their node.
  bool unpacked_more_than_once;
  struct Recomputed {
    at::Tensor value;
    bool unpacked = false;
  };
  // Per backward pass (graph task id): the recomputed tensor.
  std::unordered_map<int64_t, Recomputed> recomputed;
};

namespace {

uint32_t version_of(const at::Tensor& t) {
  return t.defined() && !t.is_inference() ? t._version() : 0;
}

constexpr const char* kDebugTip =
    "Tip: for a more detailed error, pass .debug(true) in the checkpoint's "
    "options (or create a sac::DebugGuard(true)) to log the ops of the forward "
    "and of the recomputation.";

class ForwardHooks final : public torch::autograd::SavedVariableHooks {
 public:
  explicit ForwardHooks(std::shared_ptr<CheckpointFrame> frame) : frame_(std::move(frame)) {}
  void call_pack_hook(const at::Tensor& tensor) override { holder_ = frame_->add_holder(tensor); }
  at::Tensor call_unpack_hook() override {
    check_not_modified();
    return frame_->unpack(*holder_);
  }

 private:
  // Autograd's own check of a saved tensor, which it skips for tensors held
  // by hooks. Without it, an enclosing region whose function modifies a
  // nested region's argument in place recomputes from the modified value
  // and gives silently wrong gradients.
  void check_not_modified() const {
    const VersionWatch& version = holder_->packed_version.version();
    SAC_CHECKPOINT_CHECK(!holder_->packed_version.changed(),
                         "one of the variables needed for gradient computation has been "
                         "modified by an inplace operation: a tensor saved inside a "
                         "checkpointed region is at version ",
                         version.current_version(), "; expected version ", version.version(),
                         " instead. Autograd raises this error without checkpointing too, "
                         "unless the change is a checkpointed region's recomputation writing a "
                         "tensor from outside again (with the values it had): sac tells those "
                         "apart only where that region's outside-tensor check is on, so turn "
                         "it on where .outside_tensor_check(false) was given. Otherwise it "
                         "usually means that the function modifies a tensor in place after an "
                         "op used it, often the argument of a nested sac::checkpoint: clone the "
                         "argument before modifying it (a.add_(1) -> a = a + 1), or modify it "
                         "outside the region.");
  }

  std::shared_ptr<CheckpointFrame> frame_;
  std::shared_ptr<Holder> holder_;
};

// The pass an unpack belongs to, which recomputes once: the thread's
// GraphExecGroup, else the backward pass (graph task). Unpacks outside any
// backward get an id of their own each (PyTorch uses a fresh uuid), so each
// recomputes.
int64_t current_graph_task() {
  if (const auto group = GraphExecGroup::current_id()) {
    return *group;
  }
  static std::atomic<int64_t> next_temporary{-2};
  const int64_t id = torch::autograd::get_current_graph_task_id();
  return id == -1 ? next_temporary.fetch_sub(1) : id;
}

}  // namespace

// ---- The forward: saving and holding ----------------------------------------

std::string CheckpointFrame::TensorMetadata::str() const {
  std::ostringstream out;
  out << "{shape: " << c10::IntArrayRef(sizes) << ", dtype: " << dtype << ", device: " << device
      << "}";
  return out.str();
}

CheckpointFrame::CheckpointFrame(FrameConfig config, std::shared_ptr<Recomputation> recomputation,
                                 RegionContexts contexts, ForwardState forward_state)
    : config_(config),
      recomputation_(std::move(recomputation)),
      contexts_(std::move(contexts)),
      forward_state_(std::move(forward_state)) {}

CheckpointFrame::~CheckpointFrame() { release(); }

void CheckpointFrame::abandon() {
  abandoned_ = true;
  release();
}

void CheckpointFrame::release() {
  if (released_) {
    return;
  }
  released_ = true;
  recomputation_->release();
  if (!forward_entered_) {
    return;  // e.g. the contexts refused this region: their state is another's
  }
  for (const auto& context : {contexts_.forward, contexts_.recompute}) {
    if (context) {
      context->release();
    }
  }
  if (RegionEvents* events = region_events()) {
    events->released(this);
  }
}

SavedTensorHooksFactory CheckpointFrame::forward_hooks() {
  return [frame = shared_from_this()] { return std::make_unique<ForwardHooks>(frame); };
}

std::shared_ptr<Holder> CheckpointFrame::add_holder(const at::Tensor& packed) {
  recomputation_->saved(packed);
  auto holder = std::make_shared<Holder>(packed);
  holders_.push_back(holder);
  if (RegionEvents* events = region_events()) {
    events->saved(this, packed, std::shared_ptr<const void>(holder));
  }
  if (config_.determinism_check) {
    metadata_.push_back({packed.sizes().vec(), packed.scalar_type(), packed.device()});
  }
  if (config_.value_check) {
    origins_.note_saved(packed);
    const SavedOrigin& origin = origins_.saved(values_.size());
    SavedValue saved;
    saved.checksum = ValueChecksum::of(packed);
    saved.version = version_of(packed);
    // A batch norm's running statistics: every run of such an op updates
    // them, a recomputation's too, so their values are not compared.
    saved.written_by_region = origin.state;
    if (!origin.state && !origin.made.has_value()) {
      // Made outside, or by the op saving it, which has not returned: which
      // one is known by the time the region's writes are noted.
      saved.outside.emplace(packed.getIntrusivePtr());
    }
    values_.push_back(std::move(saved));
  }
  return holder;
}

// ---- Backward: unpacking a saved tensor -------------------------------------

at::Tensor CheckpointFrame::unpack(Holder& holder) {
  if (!config_.debug) {
    return unpack_unchecked(holder);
  }
  try {
    detail::UntranslatedCheckpointErrors untranslated;  // caught just below
    return unpack_unchecked(holder);
  } catch (const CheckpointError& error) {
    rethrow_with_logs(error);
  }
}

at::Tensor CheckpointFrame::unpack_unchecked(Holder& holder) {
  SAC_CHECKPOINT_CHECK(!abandoned_,
                       "sac: a tensor saved inside a checkpointed region is needed for "
                       "backward, but the region ended with an exception, so what would "
                       "recompute it is gone. Do not backward through the outputs of a "
                       "region that threw.");
  const int64_t graph_task = current_graph_task();
  if (!passes_[graph_task].recomputed) {
    // The views earlier passes kept for a second unpack (Note [A view saved
    // by an in-place op is unpacked twice]) are not kept through this one.
    for (const auto& weak : holders_) {
      if (auto kept = weak.lock(); kept && kept->unpacked_more_than_once) {
        for (auto& [task, recomputed] : kept->recomputed) {
          if (recomputed.unpacked) {
            recomputed.value = at::Tensor();
          }
        }
      }
    }
    // A saved tensor that the region overwrites whole before reading it (a
    // buffer: Note [Overwritten before read]) is written again by the
    // recomputation, with what the forward wrote: its new version is the
    // recomputation's own, and the check of a later backward starts there.
    std::vector<std::shared_ptr<Holder>> overwritten;
    for (const auto& weak : holders_) {
      auto holder = weak.lock();
      if (holder && !holder->packed_version.changed() &&
          recomputation_->overwrites_before_reading(holder->packed_version.identity())) {
        overwritten.push_back(std::move(holder));
      }
    }
    recompute(graph_task);
    for (const auto& holder : overwritten) {
      holder->packed_version.rebase();
    }
    passes_[graph_task].recomputed = true;
    check_recomputed_tensors_match(graph_task);
  }
  auto entry = holder.recomputed.find(graph_task);
  TORCH_INTERNAL_ASSERT(entry != holder.recomputed.end(), "sac: a saved tensor was not recomputed");
  if (entry->second.unpacked && holder.unpacked_more_than_once && entry->second.value.defined()) {
    return entry->second.value;
  }
  SAC_CHECKPOINT_CHECK(!entry->second.unpacked, config_.api,
                       ": a saved tensor is being unpacked a second time in the "
                       "same backward pass. ",
                       GraphExecGroup::current_id().has_value()
                           ? "Two backward passes inside one sac::GraphExecGroup need the same "
                             "saved tensor: the backward passes of a group must cover parts of "
                             "the graph that do not overlap. Run overlapping backward passes "
                             "outside the group. "
                           : "",
                       "A custom autograd function must read its saved tensors once per "
                       "backward (call ctx->get_saved_variables() once).");
  entry->second.unpacked = true;
  return holder.unpacked_more_than_once ? entry->second.value : std::move(entry->second.value);
}

// ---- The recomputation ------------------------------------------------------

void CheckpointFrame::recompute(int64_t graph_task) {
  // Each recomputation is "sac::recompute" in the PyTorch profiler.
  ProfilerScope scope("sac::recompute");
  // A backward inside an enclosing region's forward can start this
  // recomputation while that region's modes are active on the thread; they
  // must not see its ops (nor enter them in their cache), which the ordinary backward's
  // recomputation would not show them. What it reads from outside may be
  // held by an enclosing region, whose recomputation the pass's start
  // begins: isolated too, and before this region's state is restored.
  detail::IsolationGuard isolate;
  if (config_.value_check && !forward_completed_) {
    // A backward inside the forward: what the region has written so far is
    // known now, not at the forward's end (Note [Written by the region]).
    note_written_outside_tensors(/*forward_ended=*/false);
  }
  // After the isolation: a listener may observe the recomputation's ops.
  if (RegionEvents* events = region_events()) {
    events->recomputation_began(this);
  }
  std::unique_ptr<Recomputation::Pass> pass = recomputation_->begin(*this, graph_task);
  ForwardState::Restore forward_state(forward_state_);
  {
    RegionContext::Scope context(contexts_.recompute.get());
    std::optional<OpLogScope> log;
    if (config_.debug) {
      recompute_log_.clear();
      log.emplace(recompute_log_, config_.debug_backtraces);
    }
    try {
      RecomputationScope pass_scope;
      pass->run();
    } catch (const StopRecomputation&) {
    }
  }
  // The recompute context has exited: what it did not take is released.
  if (RegionEvents* events = region_events()) {
    events->recomputation_ended(this);
  }
}

void CheckpointFrame::save_recomputed(int64_t graph_task, const at::Tensor& value) {
  // A recomputation during the forward (a backward inside the checkpointed
  // function) recomputes the region *so far*: past that point it would run
  // ops the forward has not run yet, and repeat their side effects (an
  // in-place op on a buffer) before the forward runs them. So it always
  // stops once the holders made so far are filled, early stop or not.
  const bool stop_when_filled = config_.early_stop || !forward_completed_;
  throw_if_recomputation_stopped();  // stopped or failed, and caught in the region
  PassState& pass = passes_[graph_task];
  if (stop_when_filled && pass.saved >= holders_.size()) {
    stop_recomputation();  // the first one was caught by user code
  }
  const size_t index = pass.saved++;
  SAC_CHECKPOINT_CHECK(index < holders_.size(), config_.api,
                       ": trying to save more tensors during "
                       "recomputation than during the original forward pass "
                       "(",
                       holders_.size(),
                       " in forward). The checkpointed "
                       "function ran different ops when recomputed. ",
                       kDebugTip);
  if (config_.value_check) {
    check_value(index, value, pass);
  }
  if (auto holder = holders_[index].lock()) {
    // A holder freed by a backward inside the forward needs nothing.
    auto& entry = holder->recomputed[graph_task];
    TORCH_INTERNAL_ASSERT(!entry.value.defined());
    entry = {value, false};
  }
  if (stop_when_filled && pass.saved == holders_.size()) {
    stop_recomputation();  // Note [Early stop cannot be swallowed]
  }
}

void CheckpointFrame::check_recomputed_tensors_match(int64_t graph_task) {
  if (config_.value_check) {
    check_unchecked_values(passes_[graph_task]);
  }
  const size_t saved = passes_[graph_task].saved;
  SAC_CHECKPOINT_CHECK(saved == holders_.size(), config_.api,
                       ": a different number of tensors was saved during the "
                       "original forward and recomputation.\nNumber of tensors saved during "
                       "forward: ",
                       holders_.size(), "\nNumber of tensors saved during recomputation: ", saved,
                       ".\nThe checkpointed function ran different ops when recomputed: it "
                       "depends on state that changed between forward and backward. ",
                       kDebugTip);
  if (!config_.determinism_check) {
    return;
  }
  std::string mismatches;
  for (const auto index : c10::irange(holders_.size())) {
    auto holder = holders_[index].lock();
    if (!holder) {
      continue;
    }
    const auto entry = holder->recomputed.find(graph_task);
    TORCH_INTERNAL_ASSERT(entry != holder->recomputed.end());
    const at::Tensor& t = entry->second.value;
    const TensorMetadata recomputed{t.sizes().vec(), t.scalar_type(), t.device()};
    if (!(recomputed == metadata_[index])) {
      mismatches += "tensor at position " + std::to_string(index) +
                    ":\nsaved metadata: " + metadata_[index].str() +
                    "\nrecomputed metadata: " + recomputed.str() + "\n";
    }
  }
  SAC_CHECKPOINT_CHECK(mismatches.empty(), config_.api,
                       ": recomputed values for the following tensors have "
                       "different metadata than during the forward pass.\n",
                       mismatches,
                       "The checkpointed function is not deterministic in shapes, dtypes or "
                       "devices. ",
                       kDebugTip,
                       " Turn the check off with .determinism_check(sac::DeterminismCheck::None) "
                       "only if the difference is intended.");
}

void CheckpointFrame::note_written_outside_tensors(bool forward_ended) {
  // By storage: once the region wrote a storage, every tensor it saved of
  // it is out of the comparison, those saved after the write too (their
  // values count the writes of this forward, which a recomputation inside
  // it ran once more: BatchNorm's backward inside the forward saves running
  // statistics a recomputation updated). Each tensor's value now is
  // compared with its first save, once.
  std::unordered_set<const c10::StorageImpl*> written;
  std::unordered_set<const c10::TensorImpl*> compared;
  for (const auto index : c10::irange(values_.size())) {
    SavedValue& value = values_[index];
    if (value.outside.has_value() && origins_.saved(index).made.has_value()) {
      value.outside.reset();  // its op's own output: made in the region
    }
    if (!value.outside.has_value()) {
      continue;
    }
    if (auto alive = value.outside->lock()) {
      const at::Tensor tensor(std::move(alive));
      if (value.written_by_region || (compared.insert(tensor.unsafeGetTensorImpl()).second &&
                                      !ValueChecksum::of(tensor).matches(value.checksum))) {
        written.insert(storage_key(tensor));
      }
    }
  }
  for (SavedValue& value : values_) {
    if (!value.outside.has_value()) {
      continue;
    }
    if (auto alive = value.outside->lock()) {
      value.written_by_region = written.count(storage_key(at::Tensor(std::move(alive)))) > 0;
    }
    if (forward_ended) {
      value.outside.reset();
    }
  }
}

// ---- The value check and errors ---------------------------------------------

std::string CheckpointFrame::region_name() const {
  return config_.name.empty() ? "a region with no name (name it with CheckpointOptions::name)"
                              : "region `" + config_.name + "`";
}

void CheckpointFrame::check_value(size_t index, const at::Tensor& value, PassState& pass) const {
  const TensorMetadata recomputed{value.sizes().vec(), value.scalar_type(), value.device()};
  if (!(recomputed == metadata_[index])) {
    value_differs(index,
                  "Forward: " + metadata_[index].str() + "; recomputed: " + recomputed.str() + ".");
  }
  // A version that differs is a change to an outside tensor, for the
  // outside-tensor check and autograd to judge. A tensor the region made is
  // compared whatever its version: a region's replay runs below autograd,
  // where in-place ops (dropout's bernoulli_ and div_ on its mask) bump no
  // version.
  if (values_[index].written_by_region ||
      (!origins_.saved(index).made.has_value() && version_of(value) != values_[index].version)) {
    return;
  }
  ValueChecksum checksum = ValueChecksum::of(value);
  if (checksum.on_device()) {
    pass.unchecked.emplace_back(index, std::move(checksum));
  } else if (!checksum.matches(values_[index].checksum)) {
    value_differs(index, "Its values differ (checksum " + values_[index].checksum.str() +
                             " in the forward, " + checksum.str() + " recomputed), " +
                             metadata_[index].str() + ".");
  }
}

void CheckpointFrame::check_unchecked_values(PassState& pass) const {
  std::vector<std::pair<const ValueChecksum*, const ValueChecksum*>> pairs;
  pairs.reserve(pass.unchecked.size());
  for (const auto& [index, checksum] : pass.unchecked) {
    pairs.emplace_back(&values_[index].checksum, &checksum);
  }
  const std::optional<size_t> first = ValueChecksum::first_mismatch(pairs);
  const auto unchecked = std::exchange(pass.unchecked, {});
  if (first.has_value()) {
    const auto& [index, checksum] = unchecked[*first];
    value_differs(index, "Its values differ (checksum " + values_[index].checksum.str() +
                             " in the forward, " + checksum.str() + " recomputed), " +
                             metadata_[index].str() + ".");
  }
}

void CheckpointFrame::value_differs(size_t index, const std::string& what) const {
  detail::throw_checkpoint_error(CheckpointError(
      {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
      c10::str(config_.api, ": the recomputation of ", region_name(),
               " gave a different value than its forward to tensor ", index, " of the ",
               holders_.size(), " that autograd saved there: ", origins_.saved(index).describe(),
               ". ", what, " The gradients would be wrong. ",
               origins_.saved(index).drawn.has_value() && !config_.preserve_rng_state
                   ? "A random op drew its values, and the recomputation runs without the "
                     "forward's generator states (preserve_rng_state(false)): preserve them, "
                     "or keep the random op's output (a policy that saves it). "
                   : "The region read different values when recomputed: state changed between "
                     "the forward and the backward (a write through data_ptr() behind "
                     "autograd's back, an op that draws from its own state) or a kernel is not "
                     "deterministic. Keep the output of the op that made it (a policy that "
                     "saves it; for ops that decide shapes and control flow, any_of({policy, "
                     "sac::shape_deciding_ops()})), or make what it reads stable. ",
               kDebugTip)));
}

void CheckpointFrame::rethrow_with_logs(const c10::Error& error) const {
  detail::throw_checkpoint_error(CheckpointError(
      {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
      c10::str(error.what_without_backtrace(),
               "\n\nsac::checkpoint debug log: the ops of the original forward and "
               "of the recomputation follow. Find where they part ways.\n",
               config_.debug_backtraces
                   ? "\n== 1. Backtraces of the ops of the original forward ==\n" +
                         forward_log_.backtraces("original") +
                         "\n== 2. Backtraces of the ops of the recomputation ==\n" +
                         recompute_log_.backtraces("recompute")
                   : std::string(),
               "\n== Ops executed during the original forward (", forward_log_.entries().size(),
               ") ==\n", forward_log_.ops(), "\n== Ops executed during recomputation (",
               recompute_log_.entries().size(), ") ==\n", recompute_log_.ops(),
               "\nDifferences in detach calls between the two are expected: "
               "checkpointing itself adds them.")));
}

}  // namespace sac::detail
