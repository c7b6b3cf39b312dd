#include <sac/cache/internal/cached_storages.h>

#include <c10/util/Exception.h>

namespace sac {

void CachedStorages::add_watch(Info& info, const VersionWatch& watch) {
  for (const auto& known : info.watches) {
    if (known.identity() == watch.identity()) {
      return;  // views share their base's counter: one watch covers them
    }
  }
  info.watches.push_back(watch);
}

const c10::StorageImpl* CachedStorages::hold(const at::Tensor& t) {
  if (!t.has_storage()) {
    return nullptr;
  }
  const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  Info& info = storages_[storage];
  if (info.slots++ == 0) {
    info.pin.emplace(t.storage().getWeakStorageImpl());
  }
  if (info.held++ == 0) {
    info.nbytes = t.storage().nbytes();
    bytes_ += info.nbytes;
  }
  add_watch(info, VersionWatch(t));
  return storage;
}

void CachedStorages::unhold(const c10::StorageImpl* storage) {
  if (storage == nullptr) {
    return;
  }
  Info& info = storages_.at(storage);
  if (--info.held == 0) {
    bytes_ -= info.nbytes;
  }
}

void CachedStorages::release(const c10::StorageImpl* storage) {
  if (storage == nullptr) {
    return;
  }
  const auto it = storages_.find(storage);
  TORCH_INTERNAL_ASSERT(it != storages_.end());
  if (--it->second.slots == 0) {
    storages_.erase(it);
  }
}

bool CachedStorages::watch(const at::Tensor& t) {
  if (!t.has_storage()) {
    return false;
  }
  const auto it = storages_.find(t.storage().unsafeGetStorageImpl());
  if (it == storages_.end()) {
    return false;
  }
  add_watch(it->second, VersionWatch(t));
  return true;
}

void CachedStorages::watch(const c10::StorageImpl* storage,
                           const std::vector<VersionWatch>& watches) {
  Info& info = storages_.at(storage);
  for (const auto& watch : watches) {
    add_watch(info, watch);
  }
}

void CachedStorages::note_write(const at::Tensor& t, const c10::OperatorName& op) {
  if (!t.has_storage()) {
    return;
  }
  const auto it = storages_.find(t.storage().unsafeGetStorageImpl());
  if (it != storages_.end() && !it->second.writer.has_value()) {
    it->second.writer = op;
  }
}

const std::optional<c10::OperatorName>& CachedStorages::writer(
    const c10::StorageImpl* storage) const {
  static const std::optional<c10::OperatorName> unknown;
  if (storage == nullptr) {
    return unknown;
  }
  return storages_.at(storage).writer;
}

bool CachedStorages::modified(const c10::StorageImpl* storage) const {
  if (storage == nullptr) {
    return false;
  }
  for (const auto& watch : storages_.at(storage).watches) {
    if (watch.changed()) {
      return true;
    }
  }
  return false;
}

int64_t CachedStorages::bytes_off_device() const {
  int64_t bytes = 0;
  for (const auto& [storage, info] : storages_) {
    if (info.slots > 0 && info.held == 0) {
      bytes += static_cast<int64_t>(info.nbytes);
    }
  }
  return bytes;
}

void CachedStorages::clear() {
  storages_.clear();
  bytes_ = 0;
}

}  // namespace sac
