// A tensor's storage as the key of sac's tables: its address.
//
// Tensor::storage() returns a counted reference (two atomic operations) and
// Tensor::has_storage() is a virtual call; the cache asks for the storage of
// every op's outputs, so it reads the address directly.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>

namespace sac::detail {

// The StorageImpl under `t`, or null for an undefined tensor or one without
// storage (sparse, nested, ...).
inline const c10::StorageImpl* storage_key(const at::Tensor& t) {
  return t.defined() ? t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl() : nullptr;
}

}  // namespace sac::detail
