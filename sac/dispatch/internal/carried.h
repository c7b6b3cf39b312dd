// Thread-local state that follows the work to other threads.
//
// The autograd engine runs a backward's device nodes on its own threads, and
// gives each the state of the thread that called backward through
// at::ThreadLocalState: PyTorch's saved-tensor hooks and dispatch modes
// travel that way. sac's thread-locals (its hooks, interceptors, observers
// and stash) are its own, and would not: on CUDA, a `grad(...,
// create_graph=true)` inside a checkpointed forward would run its device
// nodes where no region records. A `CarriedGuard` puts a snapshot of such
// state into c10's ThreadLocalDebugInfo, which at::ThreadLocalState carries;
// `carried()` finds it on whichever thread runs under that state.
//
//   const c10::DebugInfoKind kKind(&kKindName);  // one per kind of state
//   CarriedGuard<Snapshot> carry(kKind, snapshot_of_this_thread());
//   engine.execute(...);   // its threads see `carried<Snapshot>(kKind)`
#pragma once

#include <c10/util/ThreadLocalDebugInfo.h>

#include <memory>
#include <utility>

namespace sac::detail {

template <typename T>
struct CarriedValue final : c10::DebugInfoBase {
  template <typename... Args>
  explicit CarriedValue(Args&&... args) : value(std::forward<Args>(args)...) {}
  T value;
};

// The value of the innermost CarriedGuard of `kind` in the state this thread
// runs under (its own, or one at::ThreadLocalState gave it), or null.
template <typename T>
T* carried(c10::DebugInfoKind kind) {
  auto* info = static_cast<CarriedValue<T>*>(c10::ThreadLocalDebugInfo::get(kind));
  return info == nullptr ? nullptr : &info->value;
}

template <typename T>
class CarriedGuard {
 public:
  // Makes the snapshot, a T built from `args`.
  template <typename... Args>
  explicit CarriedGuard(c10::DebugInfoKind kind, Args&&... args)
      : guard_(kind, std::make_shared<CarriedValue<T>>(std::forward<Args>(args)...)) {}
  CarriedGuard(const CarriedGuard&) = delete;
  CarriedGuard& operator=(const CarriedGuard&) = delete;

 private:
  c10::DebugInfoGuard guard_;
};

}  // namespace sac::detail
