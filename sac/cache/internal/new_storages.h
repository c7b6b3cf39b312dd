// The storages a run has met so far, so that each one's bytes count once
// (sac::profile's output bytes and RegionStatistics' bytes are both "bytes of
// new storage", counted here).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <unordered_set>
#include <vector>

namespace sac::detail {

class NewStorages {
 public:
  // Meets `t`'s storage: its size in bytes if it is new, else 0 (also 0 for
  // a tensor without storage).
  int64_t meet(const at::Tensor& t) {
    if (!t.has_storage()) {
      return 0;
    }
    c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
    if (!met_.insert(storage).second) {
      return 0;
    }
    // The pin keeps a freed storage's address from being taken by a new one.
    pins_.emplace_back(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(storage));
    return static_cast<int64_t>(storage->nbytes());
  }

  void clear() {
    met_.clear();
    pins_.clear();
  }

 private:
  std::unordered_set<const c10::StorageImpl*> met_;
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> pins_;
};

}  // namespace sac::detail
