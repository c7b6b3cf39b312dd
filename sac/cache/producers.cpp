#include <sac/cache/internal/producers.h>

#include <sac/base/internal/storage_key.h>

#include <utility>

namespace sac::detail {

void Producers::note(const c10::OperatorHandle& op, size_t index,
                     c10::ArrayRef<at::Tensor> tensors) {
  for (const at::Tensor& t : tensors) {
    if (t.has_storage()) {
      storages_.insert_or_assign(storage_key(t),
                                 Info{CallId{op, index}, t.storage().getWeakStorageImpl(), {}});
    }
  }
}

std::optional<Producers::CallId> Producers::of(const at::Tensor& t) const {
  const auto it = storages_.find(storage_key(t));
  if (it == storages_.end()) {
    return std::nullopt;
  }
  return it->second.call;
}

void Producers::forget(const c10::StorageImpl* storage) { storages_.erase(storage); }

bool Producers::watch(const at::Tensor& t) {
  const auto it = storages_.find(storage_key(t));
  if (it == storages_.end()) {
    return false;
  }
  it->second.aliases.emplace_back(t);
  return true;
}

bool Producers::aliases_modified(const c10::StorageImpl* storage) const {
  const auto it = storages_.find(storage);
  if (it == storages_.end()) {
    return false;
  }
  for (const auto& alias : it->second.aliases) {
    if (alias.changed()) {
      return true;
    }
  }
  return false;
}

std::vector<VersionWatch> Producers::take_aliases(const c10::StorageImpl* storage) {
  const auto it = storages_.find(storage);
  if (it == storages_.end()) {
    return {};
  }
  return std::exchange(it->second.aliases, {});
}

void Producers::clear() {
  storages_.clear();
  latest_.clear();
}

}  // namespace sac::detail
