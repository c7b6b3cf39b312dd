#include <sac/cache/internal/op_cache.h>

#include <sac/base/internal/check.h>
#include <sac/dispatch/internal/boxed.h>

#include <c10/util/Exception.h>

namespace sac::detail {
namespace {

// Where the forward's and the recomputation's op sequences part ways, this is
// the usual cause.
constexpr const char* kMismatchHint =
    "The recomputation must run the same ops as the forward: this happens when "
    "the checkpointed function depends on state that changed between forward "
    "and backward (a flag, a module's training mode, data-dependent control "
    "flow). Make it deterministic, or checkpoint it without a policy.";

}  // namespace

// ---- Forward ----------------------------------------------------------------

void OpCache::begin_forward(bool track_producers) {
  filling_ = true;
  track_producers_ = track_producers;
  collectives_.clear();
}

OpCache::Entry& OpCache::add(const c10::OperatorHandle& op) {
  const size_t call_index = calls_.append(op, static_cast<uint32_t>(entries_.size()));
  return entries_.emplace_back(op, call_index);
}

void OpCache::append_recompute(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> outputs,
                               std::optional<GeneratorSnapshot> generator) {
  if (!track_producers_) {
    calls_.append(op, CallTable::kNoEntry);
    return;
  }
  Entry& call = add(op);
  Entry::Tensors defined;
  call.shape(outputs, defined);
  call.hold_weakly(defined);
  call.generator = std::move(generator);
  std::vector<at::Tensor> tensors(defined.begin(), defined.end());
  producers_.note(op, call.index, tensors);
  // A tag's own record has no tensor outputs: it leaves the call it tags
  // the latest.
  if (!tensors.empty()) {
    producers_.hold_latest(std::move(tensors));
  }
}

void OpCache::append_kept(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> outputs,
                          std::optional<GeneratorSnapshot> generator,
                          std::shared_ptr<CopyTarget> offload_to) {
  Entry& call = add(op);
  Entry::Tensors tensors;
  call.shape(outputs, tensors);
  call.keep(tensors, std::move(offload_to), storages_);
  ++kept_calls_;
  call.generator = std::move(generator);
  if (track_producers_) {
    producers_.note(op, call.index, tensors);
    producers_.drop_latest();
  }
}

size_t OpCache::calls_so_far(const c10::OperatorHandle& op) const {
  return calls_.calls_so_far(op);
}

void OpCache::note_writes_on_kept(const c10::OperatorHandle& op,
                                  c10::ArrayRef<c10::IValue> outputs) {
  const auto& returns = op.schema().returns();
  for (size_t i = 0; i < outputs.size() && i < returns.size(); ++i) {
    const c10::AliasInfo* alias = returns[i].alias_info();
    if (alias != nullptr && alias->isWrite()) {
      for_each_tensor(outputs[i],
                      [&](const at::Tensor& t) { storages_.note_write(t, &op.operator_name()); });
    }
  }
}

void OpCache::watch_aliases_of_known(c10::ArrayRef<c10::IValue> values) {
  for (const auto& value : values) {
    for_each_tensor(value, [&](const at::Tensor& t) {
      if (!storages_.watch(t) && !producers_.empty()) {
        producers_.watch(t);
      }
    });
  }
}

void OpCache::end_forward() {
  filling_ = false;
  if (track_producers_) {
    stop_tracking();
  }
  demote_modified();
}

void OpCache::demote_modified() {
  for (Entry& call : entries_) {
    if (call.state != Entry::State::Kept) {
      continue;
    }
    const auto modified = call.first_modified(storages_);
    if (!modified.has_value()) {
      continue;
    }
    demotions_.push_back({call.op.operator_name(), call.index,
                          storages_.writer(call.slots[modified->first].storage)});
    drop(call, Entry::State::Recompute);
  }
}

void OpCache::stash(TensorStash& stash) {
  TORCH_INTERNAL_ASSERT(!filling_, "sac: stash() of a cache still filling");
  for (Entry& call : entries_) {
    if (call.state == Entry::State::Kept) {
      call.stash(stash, storages_);
    }
  }
}

// ---- Late decisions ---------------------------------------------------------

std::optional<OpCache::Producer> OpCache::producer_of(const at::Tensor& t) const {
  const auto producer = producers_.of(t);
  if (!producer.has_value()) {
    return std::nullopt;
  }
  bool known = true;
  const Entry* call = find(producer->op, producer->index, known);
  TORCH_INTERNAL_ASSERT(call != nullptr, "sac: a producer without its entry");
  return Producer{producer->op, producer->index, call->state == Entry::State::Kept};
}

std::optional<std::string> OpCache::keep_late(const Producer& producer,
                                              std::shared_ptr<CopyTarget> offload_to) {
  TORCH_INTERNAL_ASSERT(filling_ && track_producers_, "sac: keep_late() while not tracking");
  bool known = true;
  Entry* call = find(producer.op, producer.call_index, known);
  TORCH_INTERNAL_ASSERT(call != nullptr, "sac: keep_late() of a call without its entry");
  TORCH_INTERNAL_ASSERT(call->state == Entry::State::Recompute);
  std::vector<at::Tensor> tensors;
  if (auto why_not = call->returned(producers_, tensors)) {
    return why_not;
  }
  call->keep(tensors, std::move(offload_to), storages_);
  ++kept_calls_;
  for (const Slot& slot : call->slots) {
    if (slot.storage != nullptr) {
      storages_.watch(slot.storage, producers_.take_aliases(slot.storage));
    }
  }
  return std::nullopt;
}

void OpCache::recompute_late(const Producer& producer) {
  TORCH_INTERNAL_ASSERT(filling_ && track_producers_, "sac: recompute_late() while not tracking");
  bool known = true;
  Entry* call = find(producer.op, producer.call_index, known);
  TORCH_INTERNAL_ASSERT(call != nullptr, "sac: recompute_late() of a call without its entry");
  TORCH_INTERNAL_ASSERT(call->state == Entry::State::Kept);
  for (const Slot& slot : call->slots) {
    if (slot.storage != nullptr) {
      producers_.forget(slot.storage);
    }
  }
  drop(*call, Entry::State::Recompute);
}

void OpCache::stop_tracking() {
  track_producers_ = false;
  producers_.clear();
  for (Entry& call : entries_) {
    if (call.state == Entry::State::Recompute) {
      call.forget_structure();
    }
  }
}

// ---- Recomputation ----------------------------------------------------------

const OpCache::Entry* OpCache::find(const c10::OperatorHandle& op, size_t call_index,
                                    bool& known) const {
  const CallTable::Found found = calls_.find(op, call_index);
  known = found.known;
  if (known) {
    return found.entry == CallTable::kNoEntry ? nullptr : &entries_[found.entry];
  }
  if (filling_) {
    return nullptr;
  }
  const size_t calls_so_far = calls_.calls_so_far(op);
  SAC_CHECKPOINT_CHECK(calls_so_far > 0, "sac: ", op.operator_name(),
                       " ran during recomputation but never in the checkpointed "
                       "forward. ",
                       kMismatchHint);
  SAC_CHECKPOINT_CHECK(false, "sac: ", op.operator_name(), " ran at least ", call_index + 1,
                       " times during recomputation but only ", calls_so_far,
                       " times in the checkpointed forward. ", kMismatchHint);
}

bool OpCache::cached(const c10::OperatorHandle& op, size_t call_index) const {
  bool known = false;
  const Entry* found = find(op, call_index, known);
  return found != nullptr && found->state != Entry::State::Recompute &&
         // Modified already: end_forward will demote it.
         !(filling_ && found->first_modified(storages_).has_value());
}

void OpCache::prefetch() {
  // A recomputation during the forward (a backward inside it) stops at the
  // forward's point so far: it would not take what lies past it.
  if (filling_) {
    return;
  }
  for (Entry& call : entries_) {
    if (call.state == Entry::State::Kept) {
      call.start_copy_back();
    }
  }
}

OpCache::Served OpCache::take(const c10::OperatorHandle& op, size_t call_index,
                              bool allow_mutation) {
  bool known = false;
  Entry* found = find(op, call_index, known);
  TORCH_INTERNAL_ASSERT(found != nullptr, "sac: take() of a call not in the cache");
  Entry& call = *found;
  if (filling_) {
    // The backward after the forward needs them too: hand out new aliases.
    TORCH_INTERNAL_ASSERT(call.state == Entry::State::Kept);
    return {call.outputs(/*consume=*/false), call.generator};
  }
  SAC_CHECKPOINT_CHECK(call.state != Entry::State::Served,
                       "sac: Trying to backward an extra time through a region "
                       "checkpointed with a selective policy: the outputs cached for ",
                       op.operator_name(), " (call ", call_index,
                       ") were already used by an earlier backward. Such a region can "
                       "be backwarded once; run its forward again before another "
                       "backward, or checkpoint it without a policy (full "
                       "recomputation allows retain_graph). A backward inside another "
                       "(torch::autograd::grad in a custom Function's backward) that "
                       "needs a tensor saved in the region is another backward too.");
  TORCH_INTERNAL_ASSERT(call.state == Entry::State::Kept);
  if (!allow_mutation) {
    const auto modified = call.first_modified(storages_);
    SAC_CHECKPOINT_CHECK(!modified.has_value(), "sac: a tensor cached for ", op.operator_name(),
                         " (call ", call_index, ", tensor ", modified->first,
                         ") was modified in place after the "
                         "checkpointed forward (",
                         modified->second,
                         "), so it no "
                         "longer holds the op's output. Do not modify the region's "
                         "outputs in place before backward, stop saving ",
                         op.operator_name(),
                         ", or allow it with allow_cache_entry_mutation(true).");
  }
  Served served{call.outputs(/*consume=*/true), std::move(call.generator)};
  drop(call, Entry::State::Served);
  return served;
}

void OpCache::release_untaken() {
  if (filling_) {
    return;  // the backward after the forward takes them
  }
  for (Entry& call : entries_) {
    if (call.state == Entry::State::Kept) {
      drop(call, Entry::State::Served);
    }
  }
}

// ---- Accounting and reset ---------------------------------------------------

OpCache::Summary OpCache::summary() const {
  Summary summary;
  // Calls entered without an entry are recomputed.
  summary.recompute_calls = calls_.calls() - entries_.size();
  for (const Entry& call : entries_) {
    if (call.state == Entry::State::Recompute) {
      ++summary.recompute_calls;
    } else if (call.offloaded()) {
      ++summary.offloaded_calls;
    } else {
      ++summary.saved_calls;
    }
  }
  summary.offloaded_bytes = storages_.bytes_off_device();
  return summary;
}

void OpCache::drop(Entry& call, Entry::State now) {
  TORCH_INTERNAL_ASSERT(call.state == Entry::State::Kept);
  call.drop(storages_);
  call.state = now;
  --kept_calls_;
}

void OpCache::clear() {
  calls_.clear();
  entries_.clear();
  storages_.clear();
  producers_.clear();
  kept_calls_ = 0;
  collectives_.clear();
  demotions_.clear();
}

}  // namespace sac::detail
