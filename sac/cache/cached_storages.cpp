#include <sac/cache/internal/cached_storages.h>

#include <sac/base/internal/storage_key.h>

#include <c10/util/Exception.h>

namespace sac::detail {

bool CachedStorages::knows(const Info& info, const void* counter) {
  for (const auto& known : info.watches) {
    if (known.identity() == counter) {
      return true;  // views share their base's counter: one watch covers them
    }
  }
  return false;
}

void CachedStorages::add_watch(Info& info, const at::Tensor& t) {
  if (!knows(info, version_counter_identity(t.unsafeGetTensorImpl()->version_counter()))) {
    info.watches.emplace_back(t);
  }
}

const c10::StorageImpl* CachedStorages::hold(const at::Tensor& t) {
  const c10::StorageImpl* storage = storage_key(t);
  if (storage == nullptr) {
    return nullptr;
  }
  Info& info = storages_[storage];
  ++info.slots;
  if (info.held++ == 0) {
    info.nbytes = storage->nbytes();
    bytes_ += info.nbytes;
  }
  add_watch(info, t);
  return storage;
}

void CachedStorages::unhold(const c10::StorageImpl* storage) {
  if (storage == nullptr) {
    return;
  }
  Info* info = storages_.find(storage);
  TORCH_INTERNAL_ASSERT(info != nullptr);
  if (--info->held == 0) {
    bytes_ -= info->nbytes;
    pin(*info, storage);
  }
}

void CachedStorages::pin(Info& info, const c10::StorageImpl* storage) {
  if (!info.pin.has_value()) {
    // Alive: a slot calls unhold and release before it lets go of its tensor.
    info.pin.emplace(c10::intrusive_ptr<c10::StorageImpl>::unsafe_reclaim_from_nonowning(
        const_cast<c10::StorageImpl*>(storage)));
  }
}

void CachedStorages::release(const c10::StorageImpl* storage, bool held) {
  if (storage == nullptr) {
    return;
  }
  Info* info = storages_.find(storage);
  TORCH_INTERNAL_ASSERT(info != nullptr);
  const bool last = --info->slots == 0;
  if (held && --info->held == 0) {
    bytes_ -= info->nbytes;
    if (!last) {
      pin(*info, storage);
    }
  }
  if (last) {
    storages_.erase(storage);
  }
}

bool CachedStorages::watch(const at::Tensor& t) {
  const c10::StorageImpl* storage = storage_key(t);
  Info* info = storage == nullptr ? nullptr : storages_.find(storage);
  if (info == nullptr) {
    return false;
  }
  add_watch(*info, t);
  return true;
}

void CachedStorages::watch(const c10::StorageImpl* storage,
                           const std::vector<VersionWatch>& watches) {
  Info* info = storages_.find(storage);
  TORCH_INTERNAL_ASSERT(info != nullptr);
  for (const auto& watch : watches) {
    if (!knows(*info, watch.identity())) {
      info->watches.push_back(watch);
    }
  }
}

void CachedStorages::note_write(const at::Tensor& t, const c10::OperatorName* op) {
  const c10::StorageImpl* storage = storage_key(t);
  if (storage == nullptr) {
    return;
  }
  Info* info = storages_.find(storage);
  if (info != nullptr && info->writer == nullptr) {
    info->writer = op;
  }
}

std::optional<c10::OperatorName> CachedStorages::writer(const c10::StorageImpl* storage) const {
  if (storage == nullptr) {
    return std::nullopt;
  }
  const Info* info = storages_.find(storage);
  TORCH_INTERNAL_ASSERT(info != nullptr);
  return info->writer == nullptr ? std::nullopt : std::make_optional(*info->writer);
}

bool CachedStorages::modified(const c10::StorageImpl* storage) const {
  if (storage == nullptr) {
    return false;
  }
  const Info* info = storages_.find(storage);
  TORCH_INTERNAL_ASSERT(info != nullptr);
  for (const auto& watch : info->watches) {
    if (watch.changed()) {
      return true;
    }
  }
  return false;
}

int64_t CachedStorages::bytes_off_device() const {
  int64_t bytes = 0;
  storages_.for_each([&](const void*, const Info& info) {
    if (info.slots > 0 && info.held == 0) {
      bytes += static_cast<int64_t>(info.nbytes);
    }
  });
  return bytes;
}

void CachedStorages::clear() {
  storages_.clear();
  bytes_ = 0;
}

}  // namespace sac::detail
