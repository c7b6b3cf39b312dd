#include <sac/cache/internal/cache_entry.h>

#include <sac/dispatch/internal/boxed.h>

#include <c10/util/Exception.h>

#include <algorithm>

namespace sac::detail {
namespace {

// How a tensor was modified through its own counter, for the errors.
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

void CacheEntry::shape(c10::ArrayRef<c10::IValue> outputs, Tensors& tensors) {
  plain = std::all_of(outputs.begin(), outputs.end(), [](const c10::IValue& output) {
    return output.isTensor() && output.toTensor().defined();
  });
  if (plain) {
    for (const auto& output : outputs) {
      slots.emplace_back(output.toTensor());
      tensors.push_back(output.toTensor());
    }
    return;
  }
  for (const auto& output : outputs) {
    structure.push_back(map_tensors(output, [&](const at::Tensor& t) {
      defined.push_back(t.defined());
      if (t.defined()) {
        slots.emplace_back(t);
        tensors.push_back(t);
      }
      return at::Tensor();
    }));
  }
}

void CacheEntry::hold_weakly(c10::ArrayRef<at::Tensor> tensors) {
  TORCH_INTERNAL_ASSERT(tensors.size() == slots.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    slots[i].returned.emplace(tensors[i].getIntrusivePtr());
  }
}

std::optional<std::string> CacheEntry::returned(const Producers& producers,
                                                std::vector<at::Tensor>& tensors) const {
  for (size_t index = 0; index < slots.size(); ++index) {
    const Slot& slot = slots[index];
    TORCH_INTERNAL_ASSERT(slot.returned.has_value(), "sac: returned() of a call held strongly");
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
    if (t.has_storage() && producers.aliases_modified(t.storage().unsafeGetStorageImpl())) {
      return c10::str("its output ", index, " was modified in place ", kThroughAnotherTensor);
    }
    tensors.push_back(std::move(t));
  }
  return std::nullopt;
}

void CacheEntry::keep(c10::ArrayRef<at::Tensor> tensors, std::shared_ptr<CopyTarget> offload_to,
                      CachedStorages& storages) {
  TORCH_INTERNAL_ASSERT(tensors.size() == slots.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    slots[i].hold(tensors[i], storages);
  }
  if (offload_to != nullptr) {
    for (auto& slot : slots) {
      if (offload_to->accepts(slot.held)) {
        slot.offload(*offload_to, storages);
      }
    }
    target = std::move(offload_to);
  }
  state = State::Kept;
}

std::vector<c10::IValue> CacheEntry::outputs(bool consume) {
  std::vector<c10::IValue> outputs;
  if (plain) {
    outputs.reserve(slots.size());
    for (Slot& slot : slots) {
      outputs.emplace_back(slot.tensor(consume, target.get()));
    }
    return outputs;
  }
  size_t slot = 0;
  size_t position = 0;
  outputs.reserve(structure.size());
  for (const auto& output : structure) {
    outputs.push_back(map_tensors(output, [&](const at::Tensor&) {
      TORCH_INTERNAL_ASSERT(position < defined.size());
      return defined[position++] ? slots[slot++].tensor(consume, target.get()) : at::Tensor();
    }));
  }
  return outputs;
}

std::optional<std::pair<size_t, std::string>> CacheEntry::first_modified(
    const CachedStorages& storages) const {
  for (size_t index = 0; index < slots.size(); ++index) {
    const Slot& slot = slots[index];
    if (slot.version.changed()) {
      return std::make_pair(index, own_change(slot.version));
    }
    if (storages.modified(slot.storage)) {
      return std::make_pair(index, std::string(kThroughAnotherTensor));
    }
  }
  return std::nullopt;
}

void CacheEntry::stash(TensorStash& stash, CachedStorages& storages) {
  for (auto& slot : slots) {
    if (slot.held.defined()) {  // not offloaded, nor stashed already
      slot.stash(stash, storages);
    }
  }
}

void CacheEntry::start_copy_back() {
  if (target == nullptr) {
    return;
  }
  for (auto& slot : slots) {
    slot.start_copy_back(*target);
  }
}

bool CacheEntry::offloaded() const {
  return std::any_of(slots.begin(), slots.end(), [](const Slot& slot) { return slot.offloaded(); });
}

void CacheEntry::drop(CachedStorages& storages) {
  for (auto& slot : slots) {
    slot.release(storages);
  }
  forget_structure();
  target.reset();
}

void CacheEntry::forget_structure() {
  structure.clear();
  defined.clear();
  slots.clear();
  generator.reset();
}

}  // namespace sac::detail
