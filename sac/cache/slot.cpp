#include <sac/cache/internal/slot.h>

#include <sac/base/internal/detached_alias.h>
#include <sac/dispatch/internal/interceptor.h>

#include <c10/core/GradMode.h>

#include <utility>

namespace sac::detail {

void Slot::hold(const at::Tensor& t, CachedStorages& storages) {
  returned.reset();
  held = detached_alias(t);
  storage = storages.hold(t);
}

void Slot::unhold(CachedStorages& storages) {
  storages.unhold(storage);  // first: it may pin the storage, which `held` keeps alive
  held = at::Tensor();
}

void Slot::offload(CopyTarget& target, CachedStorages& storages) {
  // The copy's own ops belong to no region, and autograd builds no graph for them.
  detail::IsolationGuard isolated;
  c10::AutoGradMode no_grad(false);
  from = CopyTarget::Origin::of(held);
  copy = target.copy_out(held);
  unhold(storages);
}

void Slot::stash(TensorStash& stash, CachedStorages& storages) {
  stashed = stash.hooks();
  stashed->call_pack_hook(held);
  unhold(storages);
}

void Slot::start_copy_back(CopyTarget& target) {
  if (offloaded() && incoming == nullptr) {
    detail::IsolationGuard isolated;
    c10::AutoGradMode no_grad(false);
    incoming = target.start_copy_back(copy, from);
  }
}

at::Tensor Slot::tensor(bool consume, CopyTarget* target) {
  if (held.defined()) {
    return consume ? held : detached_alias(held);
  }
  if (stashed != nullptr) {
    return stashed->call_unpack_hook();
  }
  detail::IsolationGuard isolated;
  c10::AutoGradMode no_grad(false);
  if (incoming != nullptr) {
    return std::exchange(incoming, nullptr)->take();
  }
  return target->copy_back(copy, from);
}

void Slot::release(CachedStorages& storages) {
  storages.release(storage, /*held=*/held.defined());
  held = at::Tensor();
  storage = nullptr;
  stashed.reset();
  copy = at::Tensor();
  incoming.reset();
}

}  // namespace sac::detail
