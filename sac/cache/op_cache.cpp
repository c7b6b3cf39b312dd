#include <sac/cache/internal/op_cache.h>

#include <sac/base/internal/check.h>
#include <sac/dispatch/internal/boxed.h>

#include <c10/util/Exception.h>

#include <algorithm>

namespace sac::detail {
namespace {

// Where the forward's and the recomputation's op sequences part ways, this is
// the usual cause.
constexpr const char* kMismatchHint =
    "The recomputation must run the same ops as the forward: this happens when "
    "the checkpointed function depends on state that changed between forward "
    "and backward (a flag, a module's training mode, data-dependent control "
    "flow). Make it deterministic, or checkpoint it without a policy.";

using detail::for_each_tensor;

// How a cached tensor was modified, for the errors.
std::string own_change(const VersionWatch& own) {
  return c10::str("version ", own.version(), " when cached, ", own.current_version(), " now");
}
constexpr const char* kThroughAnotherTensor =
    "through another tensor on its storage, such as the output of aten::_unsafe_view";

// `value` with each tensor place (a tensor, defined or not, alone or in a
// list) replaced by `f` of it, in order.
template <class F>
c10::IValue map_tensors(const c10::IValue& value, F&& f) {
  if (value.isTensor()) {
    return f(value.toTensor());
  }
  if (value.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : value.toTensorList()) {
      out.push_back(f(t));
    }
    return out;
  }
  if (value.isList()) {
    auto list = value.toList();
    c10::impl::GenericList out(list.elementType());
    for (const c10::IValue& element : list) {
      out.push_back(map_tensors(element, f));
    }
    return out;
  }
  return value;
}

}  // namespace

void OpCache::shape_of(Entry& call, c10::ArrayRef<c10::IValue> outputs, Tensors& tensors) {
  call.plain = std::all_of(outputs.begin(), outputs.end(), [](const c10::IValue& output) {
    return output.isTensor() && output.toTensor().defined();
  });
  if (call.plain) {
    for (const auto& output : outputs) {
      call.slots.emplace_back(output.toTensor());
      tensors.push_back(output.toTensor());
    }
    return;
  }
  // The structure stays in `outputs`, with each tensor replaced by a
  // placeholder; the defined tensors get the slots.
  for (const auto& output : outputs) {
    call.outputs.push_back(map_tensors(output, [&](const at::Tensor& t) {
      call.defined.push_back(t.defined());
      if (t.defined()) {
        call.slots.emplace_back(t);
        tensors.push_back(t);
      }
      return at::Tensor();
    }));
  }
}

OpCache::OpCalls& OpCache::calls_of(const c10::OperatorHandle& op) {
  const void* key = detail::op_key(op);
  if (key != latest_key_) {
    latest_calls_ = &ops_[key];
    latest_key_ = key;
  }
  return *latest_calls_;
}

const OpCache::OpCalls* OpCache::find_calls(const c10::OperatorHandle& op) const {
  const void* key = detail::op_key(op);
  if (key == latest_key_) {
    return latest_calls_;
  }
  OpCalls* calls = const_cast<PointerMap<OpCalls>&>(ops_).find(key);
  if (calls != nullptr) {
    latest_key_ = key;
    latest_calls_ = calls;
  }
  return calls;
}

OpCache::Entry& OpCache::add(const c10::OperatorHandle& op) {
  OpCalls& calls = calls_of(op);
  Entry& call = entries_.emplace_back(op, calls.size());
  calls.push_back(static_cast<uint32_t>(entries_.size() - 1));
  return call;
}

void OpCache::append_recompute(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> outputs,
                               std::optional<GeneratorSnapshot> generator) {
  if (!track_producers_) {
    calls_of(op).push_back(kRecomputed);
    return;
  }
  Entry& call = add(op);
  Tensors defined;
  shape_of(call, outputs, defined);
  std::vector<at::Tensor> tensors(defined.begin(), defined.end());
  for (size_t i = 0; i < tensors.size(); ++i) {
    call.slots[i].returned.emplace(tensors[i].getIntrusivePtr());
  }
  call.generator = std::move(generator);
  producers_.note(op, call.index, tensors);
  // A tag's own record has no tensor outputs: it leaves the call it tags
  // the latest.
  if (!tensors.empty()) {
    producers_.hold_latest(std::move(tensors));
  }
}

size_t OpCache::calls_so_far(const c10::OperatorHandle& op) const {
  const OpCalls* calls = find_calls(op);
  return calls == nullptr ? 0 : calls->size();
}

void OpCache::keep(Entry& call, c10::ArrayRef<at::Tensor> tensors,
                   std::shared_ptr<CopyTarget> offload_to) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    call.slots[i].hold(tensors[i], storages_);
  }
  if (offload_to != nullptr) {
    for (auto& slot : call.slots) {
      if (offload_to->accepts(slot.held)) {
        slot.offload(*offload_to, storages_);
      }
    }
    call.target = std::move(offload_to);
  }
  call.state = Entry::State::Kept;
  ++kept_calls_;
}

void OpCache::append_kept(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> outputs,
                          std::optional<GeneratorSnapshot> generator,
                          std::shared_ptr<CopyTarget> offload_to) {
  Entry& call = add(op);
  Tensors tensors;
  shape_of(call, outputs, tensors);
  keep(call, tensors, std::move(offload_to));
  call.generator = std::move(generator);
  if (track_producers_) {
    producers_.note(op, call.index, tensors);
    producers_.drop_latest();
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
  Entry* found = find(producer.op, producer.call, known);
  TORCH_INTERNAL_ASSERT(found != nullptr, "sac: keep_late() of a call without its entry");
  Entry& call = *found;
  TORCH_INTERNAL_ASSERT(call.state == Entry::State::Recompute);
  std::vector<at::Tensor> tensors;
  for (size_t index = 0; index < call.slots.size(); ++index) {
    Slot& slot = call.slots[index];
    at::Tensor t(slot.returned->lock());
    if (!t.defined()) {
      return c10::str("its output ", index,
                      " was freed already (sac holds the "
                      "outputs of the latest call only: tag a value right after the "
                      "op that returned it)");
    }
    if (slot.version.changed()) {
      return c10::str("its output ", index, " was modified in place (", own_change(slot.version),
                      ")");
    }
    if (t.has_storage() && producers_.aliases_modified(t.storage().unsafeGetStorageImpl())) {
      return c10::str("its output ", index, " was modified in place ", kThroughAnotherTensor);
    }
    tensors.push_back(std::move(t));
  }
  keep(call, tensors, std::move(offload_to));
  for (const Slot& slot : call.slots) {
    if (slot.storage != nullptr) {
      storages_.watch(slot.storage, producers_.take_aliases(slot.storage));
    }
  }
  return std::nullopt;
}

void OpCache::recompute_late(const Producer& producer) {
  TORCH_INTERNAL_ASSERT(filling_ && track_producers_, "sac: recompute_late() while not tracking");
  bool known = true;
  Entry* found = find(producer.op, producer.call, known);
  TORCH_INTERNAL_ASSERT(found != nullptr, "sac: recompute_late() of a call without its entry");
  Entry& call = *found;
  TORCH_INTERNAL_ASSERT(call.state == Entry::State::Kept);
  for (const Slot& slot : call.slots) {
    if (slot.storage != nullptr) {
      producers_.forget(slot.storage);
    }
  }
  drop(call);
  call.state = Entry::State::Recompute;
}

void OpCache::stop_tracking() {
  track_producers_ = false;
  producers_.clear();
  for (Entry& call : entries_) {
    if (call.state == Entry::State::Recompute) {
      call.outputs.clear();
      call.defined.clear();
      call.slots.clear();
      call.generator.reset();
    }
  }
}

std::optional<std::pair<size_t, std::string>> OpCache::first_modified(const Entry& call) const {
  for (size_t index = 0; index < call.slots.size(); ++index) {
    const Slot& slot = call.slots[index];
    if (slot.version.changed()) {
      return std::make_pair(index, own_change(slot.version));
    }
    if (storages_.modified(slot.storage)) {
      return std::make_pair(index, std::string(kThroughAnotherTensor));
    }
  }
  return std::nullopt;
}

void OpCache::demote_modified() {
  for (Entry& call : entries_) {
    if (call.state != Entry::State::Kept) {
      continue;
    }
    const auto modified = first_modified(call);
    if (!modified.has_value()) {
      continue;
    }
    demotions_.push_back({call.op.operator_name(), call.index,
                          storages_.writer(call.slots[modified->first].storage)});
    drop(call);
    call.state = Entry::State::Recompute;
  }
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

void OpCache::begin_forward(bool track_producers) {
  filling_ = true;
  track_producers_ = track_producers;
  collectives_.clear();
}

void OpCache::end_forward() {
  filling_ = false;
  if (track_producers_) {
    stop_tracking();
  }
  demote_modified();
}

OpCache::Summary OpCache::summary() const {
  Summary summary;
  ops_.for_each([&](const void*, const OpCalls& calls) {
    for (size_t index = 0; index < calls.size(); ++index) {
      const uint32_t entry = calls[index];
      if (entry == kRecomputed || entries_[entry].state == Entry::State::Recompute) {
        ++summary.recompute_calls;
        continue;
      }
      const Entry& call = entries_[entry];
      const bool offloaded = std::any_of(call.slots.begin(), call.slots.end(),
                                         [](const Slot& slot) { return slot.offloaded(); });
      ++(offloaded ? summary.offloaded_calls : summary.saved_calls);
    }
  });
  summary.offloaded_bytes = storages_.bytes_off_device();
  return summary;
}

void OpCache::stash(TensorStash& stash) {
  TORCH_INTERNAL_ASSERT(!filling_, "sac: stash() of a cache still filling");
  for (Entry& call : entries_) {
    if (call.state != Entry::State::Kept) {
      continue;
    }
    for (auto& slot : call.slots) {
      if (slot.held.defined()) {  // not offloaded, nor stashed already
        slot.stash(stash, storages_);
      }
    }
  }
}

void OpCache::prefetch() {
  // A recomputation during the forward (a backward inside it) stops at the
  // forward's point so far: it would not take what lies past it.
  if (filling_) {
    return;
  }
  for (Entry& call : entries_) {
    if (call.state != Entry::State::Kept || call.target == nullptr) {
      continue;
    }
    for (auto& slot : call.slots) {
      slot.start_copy_back(*call.target);
    }
  }
}

std::vector<c10::IValue> OpCache::outputs_of(Entry& call, bool consume) {
  if (call.plain) {
    std::vector<c10::IValue> outputs;
    outputs.reserve(call.slots.size());
    for (Slot& slot : call.slots) {
      outputs.emplace_back(slot.tensor(consume, call.target.get()));
    }
    return outputs;
  }
  size_t slot = 0;
  size_t position = 0;
  std::vector<c10::IValue> outputs;
  outputs.reserve(call.outputs.size());
  for (const auto& output : call.outputs) {
    outputs.push_back(map_tensors(output, [&](const at::Tensor&) {
      TORCH_INTERNAL_ASSERT(position < call.defined.size());
      return call.defined[position++] ? call.slots[slot++].tensor(consume, call.target.get())
                                      : at::Tensor();
    }));
  }
  return outputs;
}

const OpCache::Entry* OpCache::find(const c10::OperatorHandle& op, size_t call, bool& known) const {
  const OpCalls* calls = find_calls(op);
  const size_t count = calls == nullptr ? 0 : calls->size();
  known = call < count;
  if (known) {
    const uint32_t entry = (*calls)[call];
    return entry == kRecomputed ? nullptr : &entries_[entry];
  }
  if (filling_) {
    return nullptr;
  }
  const size_t calls_so_far = count;
  SAC_CHECKPOINT_CHECK(calls_so_far > 0, "sac: ", op.operator_name(),
                       " ran during recomputation but never in the checkpointed "
                       "forward. ",
                       kMismatchHint);
  SAC_CHECKPOINT_CHECK(false, "sac: ", op.operator_name(), " ran at least ", call + 1,
                       " times during recomputation but only ", calls_so_far,
                       " times in the checkpointed forward. ", kMismatchHint);
}

bool OpCache::cached(const c10::OperatorHandle& op, size_t call) const {
  bool known = false;
  const Entry* found = find(op, call, known);
  return found != nullptr && found->state != Entry::State::Recompute &&
         // Modified already: end_forward will demote it.
         !(filling_ && first_modified(*found).has_value());
}

OpCache::Served OpCache::take(const c10::OperatorHandle& op, size_t index, bool allow_mutation) {
  bool known = false;
  Entry* found = find(op, index, known);
  TORCH_INTERNAL_ASSERT(found != nullptr, "sac: take() of a call not in the cache");
  Entry& call = *found;
  if (filling_) {
    // The backward after the forward needs them too: hand out new aliases.
    TORCH_INTERNAL_ASSERT(call.state == Entry::State::Kept);
    return {outputs_of(call, /*consume=*/false), call.generator};
  }
  SAC_CHECKPOINT_CHECK(call.state != Entry::State::Served,
                       "sac: Trying to backward an extra time through a region "
                       "checkpointed with a selective policy: the outputs cached for ",
                       op.operator_name(), " (call ", index,
                       ") were already used by an earlier backward. Such a region can "
                       "be backwarded once; run its forward again before another "
                       "backward, or checkpoint it without a policy (full "
                       "recomputation allows retain_graph). A backward inside another "
                       "(torch::autograd::grad in a custom Function's backward) that "
                       "needs a tensor saved in the region is another backward too.");
  TORCH_INTERNAL_ASSERT(call.state == Entry::State::Kept);
  if (!allow_mutation) {
    const auto modified = first_modified(call);
    SAC_CHECKPOINT_CHECK(!modified.has_value(), "sac: a tensor cached for ", op.operator_name(),
                         " (call ", index, ", tensor ", modified->first,
                         ") was modified in place after the "
                         "checkpointed forward (",
                         modified->second,
                         "), so it no "
                         "longer holds the op's output. Do not modify the region's "
                         "outputs in place before backward, stop saving ",
                         op.operator_name(),
                         ", or allow it with allow_cache_entry_mutation(true).");
  }
  Served served{outputs_of(call, /*consume=*/true), std::move(call.generator)};
  drop(call);
  call.state = Entry::State::Served;
  return served;
}

void OpCache::release_untaken() {
  if (filling_) {
    return;  // the backward after the forward takes them
  }
  for (Entry& call : entries_) {
    if (call.state == Entry::State::Kept) {
      drop(call);
      call.state = Entry::State::Served;
    }
  }
}

void OpCache::clear() {
  ops_.clear();
  latest_key_ = nullptr;
  latest_calls_ = nullptr;
  entries_.clear();
  storages_.clear();
  producers_.clear();
  kept_calls_ = 0;
  collectives_.clear();
  demotions_.clear();
}

void OpCache::drop(Entry& call) {
  for (auto& slot : call.slots) {
    slot.release(storages_);
  }
  call.outputs.clear();
  call.defined.clear();
  call.slots.clear();
  call.generator.reset();
  call.target.reset();
  --kept_calls_;
}

}  // namespace sac::detail
