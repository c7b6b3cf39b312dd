#include <sac/record/internal/recorder.h>

#include <sac/dispatch/internal/op_facts.h>
#include <sac/base/internal/generators.h>
#include <sac/dispatch/internal/boxed.h>
#include <sac/policy/internal/op_traits.h>

#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <unordered_set>

namespace sac::detail {
namespace {

// ---- What an op reads and writes --------------------------------------------

// ---- What a region refuses --------------------------------------------------

// Whether `op` runs as part of a compile trace rather than eagerly: a tracer's mode
// is active (those of torch.compile instruction aside while they run their kernels,
// on meta tensors), or a tensor argument is a meta tensor, as a fake
// tensor's data is.
bool traced(c10::ArrayRef<c10::IValue> args) {
  using c10::impl::TorchDispatchModeKey;
  using c10::impl::TorchDispatchModeTLS;
  // Every infra mode c10 knows is one of a tracer's (FAKE, PROXY and
  // FUNCTIONAL to date): one that a release adds is taken for one too
  // (docs/c10-contract.md, "Infra mode keys").
  if (TorchDispatchModeTLS::any_modes_set()) {  // rarely: skips copying the modes
    constexpr int kModes = static_cast<int>(TorchDispatchModeKey::NUM_MODE_KEYS);
    for (int mode = 0; mode < kModes; ++mode) {
      if (TorchDispatchModeTLS::get_mode(static_cast<TorchDispatchModeKey>(mode)).has_value()) {
        return true;
      }
    }
  }
  bool meta = false;
  for (const c10::IValue& arg : args) {
    detail::for_each_tensor(arg, [&](const at::Tensor& t) { meta = meta || t.is_meta(); });
  }
  return meta;
}

void refuse_a_trace(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  const std::string& name = op.operator_name().name;
  TORCH_CHECK(!traced(args), "sac::CheckpointRegion: the region runs ", name,
              " as part of a compile trace (meta tensors, or a fake, proxy or functional mode: "
              "torch.compile tracing, make_fx, torch.export). The region records the eager ops "
              "it runs and replays them; it cannot record a compile trace, so torch.compile is not "
              "supported inside it. A compiled function called in the region is traced there "
              "again (the region changes the dispatch state its guards check). Call compiled "
              "code outside the region, or let torch.compile checkpoint it (torch.utils.checkpoint "
              "inside the compiled function, or torch._functorch.config.activation_memory_budget). "
              "A DTensor (tensor parallelism) runs ops on meta tensors too, to propagate its "
              "sharding: the region cannot record DTensors either. Under tensor parallelism "
              "checkpoint the layers with torch.utils.checkpoint and sac.context_fn(policy) "
              "(sac::checkpoint in C++).");
}

// The region records below tensor subclasses with a __torch_dispatch__ (a
// DTensor): it would keep the subclass tensors autograd saves whole, as
// outside tensors, and recompute nothing.
void refuse_a_subclass(const at::Tensor& t) {
  TORCH_CHECK(!t.key_set().has(c10::DispatchKey::Python),
              "sac::CheckpointRegion: autograd saves a tensor subclass with a "
              "__torch_dispatch__ in the region (a DTensor, under tensor parallelism). The region "
              "records the ops below such subclasses and cannot recompute the subclass tensors "
              "autograd saves. Under tensor parallelism checkpoint the layers with "
              "torch.utils.checkpoint.checkpoint(fn, ..., use_reentrant=False, "
              "context_fn=sac.context_fn(policy)) (in C++, sac::checkpoint), which recomputes "
              "DTensor ops as they are.");
}

// ---- Storages ---------------------------------------------------------------

bool holds_tensor(const c10::IValue& value) {
  if (value.isTensor()) {
    return value.toTensor().defined();
  }
  if (value.isList()) {
    for (const auto& element : value.toListRef()) {
      if (holds_tensor(element)) {
        return true;
      }
    }
  } else if (value.isTuple()) {
    for (const auto& element : value.toTupleRef().elements()) {
      if (holds_tensor(element)) {
        return true;
      }
    }
  } else if (value.isGenericDict()) {
    for (const auto& entry : value.toGenericDict()) {
      if (holds_tensor(entry.key()) || holds_tensor(entry.value())) {
        return true;
      }
    }
  }
  return false;
}

// Whether `t`'s memory came from an allocator. Memory that did not
// (torch::from_blob, DLPack) belongs to someone else, who may free or
// change it before backward.
bool owns_memory(const at::Tensor& t) { return t.storage().allocator() != nullptr; }

// Whether `t` is all of its storage, laid out as a copy would lay it out.
// All of `t`'s storage as one tensor of its dtype (`t` itself when it spans
// it), with `t`'s version counter and no autograd graph.
at::Tensor whole_storage(const at::Tensor& t) {
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  c10::intrusive_ptr<c10::TensorImpl> whole = impl->shallow_copy_and_detach(
      /*version_counter=*/impl->version_counter(),
      /*allow_tensor_metadata_change=*/true);
  if (!detail::spans_storage(t)) {
    const int64_t elements = static_cast<int64_t>(t.storage().nbytes() / t.itemsize());
    const int64_t stride = 1;
    whole->set_sizes_and_strides(c10::IntArrayRef(elements), c10::IntArrayRef(stride),
                                 /*storage_offset=*/int64_t{0});
  }
  return at::Tensor(std::move(whole));
}

// Whether host code changed `storage` since its bytes were taken. Only CPU
// memory is compared: host code writes host memory.
bool differs_from(const c10::Storage& storage, const at::Tensor& bytes) {
  if (storage.device_type() != c10::kCPU) {
    return false;
  }
  const size_t n = storage.nbytes();
  return static_cast<int64_t>(n) != bytes.numel() ||
         (n > 0 && std::memcmp(storage.data(), bytes.const_data_ptr(), n) != 0);
}

}  // namespace

Recorder::Recorder(Recording& recording, const detail::OpInterceptor* region_interceptor,
                   SaveOutside save_outside)
    : recording_(recording),
      region_interceptor_(region_interceptor),
      save_outside_(std::move(save_outside)) {}

// ---- The recording: each op, before and after -------------------------------

void Recorder::mark(const at::Tensor& t) {
  refuse_a_subclass(t);
  before_read(t);  // autograd hands it to backward: a read
  note_read(t);
  const ValueId value = resolve(t);
  recording_.instructions.push_back({Instruction::Kind::Mark, value});
}

void Recorder::finish() {
  known_.clear();
  storages_.clear();
  read_.clear();
  pending_.reset();
  save_outside_ = nullptr;
}

void Recorder::before_op(const detail::ObservedOp& call, c10::ArrayRef<c10::IValue> args) {
  pending_.reset();
  pending_host_writes_.clear();
  const c10::OperatorHandle& op = call.op;
  refuse_a_trace(op, args);
  if (detail::communicates(op)) {
    recording_.communication.note(op, args);
  }
  // The copies and constants a call needs are made before it runs, reads
  // first: an in-place op on memory filled by host code reads it
  // as it was, and a call that reads and writes outside memory (BatchNorm's
  // running statistics) reads the copy in replay.
  for (size_t i = 0; i < args.size(); ++i) {
    if (reads_argument(op, i)) {
      detail::for_each_tensor(args[i], [&](const at::Tensor& t) {
        before_read(t);
        note_read(t);
      });
    }
  }
  bool writes_any = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (writes_argument_declared_or_not(op, i, args)) {
      writes_any = true;
      const bool whole = !reads_argument(op, i);
      detail::for_each_tensor(args[i], [&](const at::Tensor& t) { before_write(t, whole); });
    }
  }
  Call recorded(op);
  recorded.below = call.below;
  recorded.intercepted = call.interceptor == region_interceptor_;
  recorded.replayed = writes_any;  // and calls that return tensors (after_op)
  recorded.arguments.reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    recorded.arguments.push_back(record_argument(op, i, args[i]));
  }
  pending_ = std::move(recorded);
}

void Recorder::after_op(const detail::ObservedOp& call, c10::ArrayRef<c10::IValue> outputs) {
  if (!pending_.has_value() || pending_->op != call.op) {
    pending_.reset();
    return;
  }
  Call recorded = std::move(*pending_);
  pending_.reset();
  for (StorageState* state : pending_host_writes_) {
    state->seen = copy_bytes(c10::Storage(state->storage.lock()));
  }
  pending_host_writes_.clear();
  const bool fresh_memory = detail::makes_uninitialized_memory(recorded.op);
  recorded.first_output = recording_.values;
  for (const auto& output : outputs) {
    detail::for_each_tensor(output, [&](const at::Tensor& t) {
      const ValueId value = recording_.new_value();
      remember(t, value);
      if (fresh_memory) {
        if (StorageState* state = storage_of(t)) {
          state->host_written = true;
        }
      }
      ++recorded.outputs;
    });
  }
  recorded.replayed = recorded.replayed || recorded.outputs > 0;
  recording_.instructions.push_back(
      {Instruction::Kind::Call, static_cast<uint32_t>(recording_.calls.size())});
  recording_.calls.push_back(std::move(recorded));
}

Argument Recorder::record_argument(const c10::OperatorHandle& op, size_t index,
                                   const c10::IValue& arg) {
  Argument recorded;
  if (arg.isTensor() && arg.toTensor().defined()) {
    recorded.kind = Argument::Kind::Tensor;
    recorded.tensors.push_back(resolve(arg.toTensor()));
    return recorded;
  }
  if (arg.isGenerator()) {
    // Its state now, before the call draws: replay draws from a copy.
    recorded.kind = Argument::Kind::Generator;
    recorded.constant = c10::IValue(detail::locked_clone(arg.toGenerator()));
    return recorded;
  }
  TORCH_CHECK(!arg.isStorage(), "sac::CheckpointRegion: cannot record ", op.operator_name(),
              ": its argument '", op.schema().arguments()[index].name(),
              "' is a Storage, which the recording cannot follow from one op "
              "to the next. Keep this op outside the region, or checkpoint "
              "this code with sac::checkpoint.");
  if (arg.isList() && holds_tensor(arg)) {
    recorded.kind = Argument::Kind::List;
    c10::List<c10::IValue> list = arg.toList().copy();
    const bool optional_elements = !arg.isTensorList();
    for (size_t i = 0; i < list.size(); ++i) {
      const c10::IValue element = list.get(i);
      TORCH_CHECK(element.isTensor() || element.isNone(), "sac::CheckpointRegion: cannot record ",
                  op.operator_name(), ": its argument '", op.schema().arguments()[index].name(),
                  "' nests tensors deeper than a list of tensors.");
      if (element.isTensor() && element.toTensor().defined()) {
        recorded.tensors.push_back(resolve(element.toTensor()));
        list.set(i, optional_elements ? c10::IValue() : c10::IValue(at::Tensor()));
      } else {
        recorded.tensors.push_back(std::nullopt);
      }
    }
    recorded.constant = c10::IValue(std::move(list));
    return recorded;
  }
  TORCH_CHECK(!holds_tensor(arg), "sac::CheckpointRegion: cannot record ", op.operator_name(),
              ": its argument '", op.schema().arguments()[index].name(),
              "' holds tensors in a container other than a list.");
  recorded.constant = arg;
  return recorded;
}

// ---- Values: the tensors an op takes, and where they come from --------------

ValueId Recorder::resolve(const at::Tensor& t) {
  const auto known = known_.find(t.unsafeGetTensorImpl());
  if (known != known_.end()) {
    return known->second.value;
  }
  // A tensor no op returned, on memory a value lies on: an alias made
  // without an op. It is as_strided of the last value made there.
  StorageState* state = storage_of(t);
  if (state != nullptr && state->latest.has_value() && state->latest_dtype == t.dtype()) {
    if (!state->outside.empty()) {
      // On outside memory: read as it is now.
      watch_read(t, state->outside.back());
    }
    return add_alias(t, *state->latest);
  }
  return add_outside(t);
}

ValueId Recorder::add_alias(const at::Tensor& t, ValueId base) {
  Alias alias{recording_.new_value(), base, t.sizes().vec(), t.strides().vec(), t.storage_offset()};
  recording_.instructions.push_back(
      {Instruction::Kind::Alias, static_cast<uint32_t>(recording_.aliases.size())});
  recording_.aliases.push_back(std::move(alias));
  const ValueId value = recording_.aliases.back().value;
  remember(t, value);
  return value;
}

ValueId Recorder::add_outside(const at::Tensor& t) {
  if (!t.has_storage()) {  // sparse, nested: kept as they are
    Outside outside = layout_of(t);
    outside.saved = save_outside_(t);
    const size_t index = append_outside(std::move(outside));
    watch_read(t, index);
    remember(t, recording_.outside[index].value);
    return recording_.outside[index].value;
  }
  StorageState& state = state_of(t);
  if (!owns_memory(t)) {
    // Someone else's memory may be gone (or changed) by backward.
    state.foreign = state.host_written = true;
    take_snapshot(t, state);
    state.seen = recording_.snapshots[*state.snapshot];
  }
  if (state.snapshot.has_value()) {
    return add_copied(t, state);
  }
  // One value for the whole storage, kept once; `t` is an alias of it.
  const at::Tensor whole = whole_storage(t);
  Outside outside = layout_of(whole);
  outside.saved = save_outside_(whole);
  const size_t index = append_outside(std::move(outside));
  state.outside.push_back(index);
  watch_read(t, index);
  const ValueId value = recording_.outside[index].value;
  if (detail::spans_storage(t)) {
    remember(t, value);
    return value;
  }
  state.latest = value;
  state.latest_dtype = t.dtype();
  return add_alias(t, value);
}

void Recorder::watch_read(const at::Tensor& t, size_t outside) {
  recording_.outside_reads.push_back({VersionWatch(t), t.sizes().vec(), outside});
}

ValueId Recorder::add_copied(const at::Tensor& t, StorageState& state) {
  Outside outside = layout_of(t);
  outside.snapshot = state.snapshot;
  const size_t index = append_outside(std::move(outside));
  state.outside.push_back(index);
  remember(t, recording_.outside[index].value);
  return recording_.outside[index].value;
}

Outside Recorder::layout_of(const at::Tensor& t) {
  Outside outside;
  outside.value = recording_.new_value();
  outside.sizes = t.sizes().vec();
  outside.strides = t.strides().vec();
  outside.storage_offset = t.storage_offset();
  outside.options = t.options();
  return outside;
}

size_t Recorder::append_outside(Outside outside) {
  const size_t index = recording_.outside.size();
  recording_.instructions.push_back({Instruction::Kind::Outside, static_cast<uint32_t>(index)});
  recording_.outside.push_back(std::move(outside));
  return index;
}

Recorder::StorageState& Recorder::state_of(const at::Tensor& t) {
  const c10::Storage& storage = t.storage();
  return storages_.try_emplace(storage.unsafeGetStorageImpl(), storage.getWeakStorageImpl())
      .first->second;
}

void Recorder::remember(const at::Tensor& t, ValueId value) {
  known_.insert_or_assign(t.unsafeGetTensorImpl(),
                          Known{WeakTensorImpl(t.getIntrusivePtr()), value});
  if (!t.has_storage()) {
    return;
  }
  StorageState& state = state_of(t);
  state.latest = value;
  state.latest_dtype = t.dtype();
}

Recorder::StorageState* Recorder::storage_of(const at::Tensor& t) {
  if (!t.has_storage()) {
    return nullptr;
  }
  const auto it = storages_.find(t.storage().unsafeGetStorageImpl());
  return it == storages_.end() ? nullptr : &it->second;
}

// ---- Outside storage: writes, snapshots and reads ---------------------------

void Recorder::before_write(const at::Tensor& t, bool whole) {
  if (!t.has_storage()) {
    resolve(t);
    return;
  }
  if (known_.count(t.unsafeGetTensorImpl()) == 0 && storage_of(t) == nullptr && owns_memory(t)) {
    if (!(whole && detail::spans_storage(t))) {
      // Outside memory seen first by a write: copied before it is named, so
      // that it is not saved as well.
      take_snapshot(t, state_of(t));
    }
  }
  resolve(t);
  StorageState& state = *storage_of(t);
  if (whole && detail::spans_storage(t) && !state.outside.empty() && !state.snapshot.has_value() &&
      read_.count(t.storage().unsafeGetStorageImpl()) == 0) {
    // Outside memory that the region overwrites whole before anything read
    // it (FSDP copies gathered parameters into theirs): what it held is
    // never read, so nothing of it is kept, and replay makes it anew.
    for (const size_t index : state.outside) {
      recording_.outside[index].fresh = true;
      recording_.outside[index].saved = torch::autograd::SavedVariable();
    }
    state.outside.clear();
  }
  if (state.host_written) {
    if (whole && detail::spans_storage(t) && !state.foreign) {
      // An op makes every byte: host code wrote nothing that stays.
      state.host_written = false;
      state.seen = at::Tensor();
    } else {
      // What host code wrote and the write leaves in place is kept.
      fill_if_changed(t, state);
      pending_host_writes_.push_back(&state);
    }
  }
  if (!state.outside.empty() && !state.snapshot.has_value()) {
    take_snapshot(t, state);
  }
}

void Recorder::take_snapshot(const at::Tensor& t, StorageState& state) {
  // The region writes memory it did not make. Replay must not write it a
  // second time: it replays on a copy of the memory as it is now.
  state.snapshot = recording_.snapshots.size();
  recording_.snapshots.push_back(copy_bytes(t.storage()));
  for (const size_t index : state.outside) {
    Outside& outside = recording_.outside[index];
    outside.saved = torch::autograd::SavedVariable();
    outside.snapshot = state.snapshot;
  }
}

at::Tensor Recorder::copy_bytes(const c10::Storage& storage) {
  // Called from autograd's hooks (mark) too: no observer sees the copy.
  detail::IsolationGuard unseen;
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return bytes_of(storage).clone();
}

void Recorder::note_read(const at::Tensor& t) {
  if (t.has_storage()) {
    read_.insert(t.storage().unsafeGetStorageImpl());
  }
}

void Recorder::before_read(const at::Tensor& t) {
  StorageState* state = storage_of(t);
  if (state != nullptr && state->host_written) {
    fill_if_changed(t, *state);
  }
}

void Recorder::fill_if_changed(const at::Tensor& t, StorageState& state) {
  if (state.seen.defined() && !differs_from(t.storage(), state.seen)) {
    return;
  }
  const size_t snapshot = recording_.snapshots.size();
  recording_.snapshots.push_back(copy_bytes(t.storage()));
  state.seen = recording_.snapshots.back();
  const ValueId value = resolve(t);
  recording_.instructions.push_back(
      {Instruction::Kind::Fill, static_cast<uint32_t>(recording_.fills.size())});
  recording_.fills.push_back({value, snapshot});
}

}  // namespace sac::detail
