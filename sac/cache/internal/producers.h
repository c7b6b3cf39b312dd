// Which call in the cache returned each storage, while a forward fills it with
// late decisions: a tag (sac/policy/tag.h) may keep or drop a call after the
// op returned, until the forward ends.
//
// A storage's address is the key; a weak reference pins it, so that a freed
// storage's address names no other one. Version counters of other tensors
// seen on a storage (aliases with counters of their own) are kept until the
// call is kept, when the cache's storages take them over.
#pragma once

#include <sac/base/internal/version_watch.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <cstddef>
#include <optional>
#include <unordered_map>
#include <vector>

namespace sac::detail {

class Producers {
 public:
  struct CallId {
    c10::OperatorHandle op;
    size_t index;
  };

  // CallId `index` of `op` returned `tensors`.
  void note(const c10::OperatorHandle& op, size_t index, c10::ArrayRef<at::Tensor> tensors);
  // The call that returned `t`'s storage, if noted.
  std::optional<CallId> of(const at::Tensor& t) const;
  // Forgets the call that returned `storage`.
  void forget(const c10::StorageImpl* storage);

  // Watches `t`'s counter if `t` lies on a noted storage; false otherwise.
  bool watch(const at::Tensor& t);
  // Whether a watched alias on `storage` was modified in place.
  bool aliases_modified(const c10::StorageImpl* storage) const;
  // The watches of the aliases on `storage`, handed over (none left here).
  std::vector<VersionWatch> take_aliases(const c10::StorageImpl* storage);

  // Autograd keeps nothing in a checkpointed forward: an output that only
  // autograd wanted (native_layer_norm's mean) dies as soon as the op
  // returns. Holding the latest call's outputs lets tags right after the
  // call keep all of them; the next call with tensor outputs replaces them.
  void hold_latest(std::vector<at::Tensor> outputs) { latest_ = std::move(outputs); }
  void drop_latest() { latest_.clear(); }

  bool empty() const { return storages_.empty(); }
  void clear();

 private:
  struct Info {
    CallId call;
    c10::weak_intrusive_ptr<c10::StorageImpl> pin;
    std::vector<VersionWatch> aliases;
  };
  std::unordered_map<const c10::StorageImpl*, Info> storages_;
  std::vector<at::Tensor> latest_;
};

}  // namespace sac::detail
