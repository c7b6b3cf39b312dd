// The storages under the tensors an OpCache keeps, each counted once however
// many cached tensors share it.
//
// Per storage: how many of the cache's slots are on it, how many of those
// hold its memory on the device (the cache's bytes), and every version
// counter known on it. Tensors on one storage can have counters of their
// own (aten::_unsafe_view returns one), so a change through any of them
// changes what every cached tensor on it reads. A storage whose memory has
// left the device (stashed or offloaded) is pinned by a weak reference, so
// that its address names no other storage while the cache knows it.
#pragma once

#include <sac/base/internal/pointer_map.h>
#include <sac/base/internal/version_watch.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/operator_name.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/SmallVector.h>
#include <c10/util/intrusive_ptr.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace sac::detail {

class CachedStorages {
 public:
  // A slot on `t`'s storage that holds it on the device: counts its bytes
  // the first time and watches `t`'s counter. Returns the storage's key,
  // null for a tensor without storage (nothing counted).
  const c10::StorageImpl* hold(const at::Tensor& t);
  // A slot on `storage` no longer holds it on the device (stashed,
  // offloaded or served); the bytes go when no slot does.
  void unhold(const c10::StorageImpl* storage);
  // A slot on `storage` is gone (with `held`, one that held it on the
  // device); the storage is forgotten with its last slot.
  void release(const c10::StorageImpl* storage, bool held);

  // Watches `t`'s version counter if `t` lies on a storage known here;
  // false otherwise.
  bool watch(const at::Tensor& t);
  // Adds counters seen on `storage` before it was known here.
  void watch(const c10::StorageImpl* storage, const std::vector<VersionWatch>& watches);
  // Whether a tensor on `storage` was modified in place through any counter
  // known on it.
  bool modified(const c10::StorageImpl* storage) const;
  // Notes `op` as having written `t` in place, if `t` lies on a storage
  // known here; the first such op is the storage's writer.
  void note_write(const at::Tensor& t, const c10::OperatorName* op);
  std::optional<c10::OperatorName> writer(const c10::StorageImpl* storage) const;

  // Bytes of the storages some slot holds on the device.
  size_t bytes() const { return bytes_; }
  // Bytes of the storages no slot holds on the device (all offloaded or
  // stashed).
  int64_t bytes_off_device() const;
  bool empty() const { return storages_.empty(); }
  void clear();

 private:
  struct Info {
    size_t slots = 0;                           // slots on it
    size_t held = 0;                            // of which hold it on the device
    size_t nbytes = 0;                          // its size when first held
    c10::SmallVector<VersionWatch, 1> watches;  // one per counter known on it (inline: usually one)
    // Taken when no slot holds it on the device any more: until then a held
    // tensor keeps it alive.
    std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> pin;
    const c10::OperatorName* writer = nullptr;  // the dispatcher's, of a registered op
  };
  // Whether `info` watches the version counter whose identity is `counter`.
  static bool knows(const Info& info, const void* counter);
  // Watches `t`'s counter on `info`'s storage, unless known.
  static void add_watch(Info& info, const at::Tensor& t);
  // Pins `storage` (alive now) once no slot holds it on the device.
  static void pin(Info& info, const c10::StorageImpl* storage);

  PointerMap<Info> storages_;
  size_t bytes_ = 0;
};

}  // namespace sac::detail
