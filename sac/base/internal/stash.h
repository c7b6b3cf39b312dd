// Where the tensors a region keeps for backward wait in the meantime.
//
// Autograd keeps the tensors it saves through saved-tensor hooks, which
// sac::OffloadGuard (sac/offload/offload.h) sets to move them to host memory.
// A checkpointed region also keeps tensors of its own, beside autograd: its
// inputs, and the outputs a selective policy caches. PyTorch's SAC keeps
// those where they are, whatever hooks are active (PyTorch issue 191236). In
// sac they go into the thread's current *stash* if there is one: the
// checkpoint (sac/checkpoint/) and the cache (sac/cache/) ask for it here,
// without knowing what it does with them; the offload guard installs one.
#pragma once

#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <memory>

namespace sac::detail {

class TensorStash {
 public:
  virtual ~TensorStash() = default;
  // Hooks for one tensor: call_pack_hook takes it into the stash (or leaves
  // it where it is), call_unpack_hook gives back an equal tensor (same
  // values, sizes, strides, dtype and device), once or more. The hooks own
  // what they need: they outlive the stash's scope.
  virtual std::unique_ptr<torch::autograd::SavedVariableHooks> hooks() = 0;
};

// The innermost stash installed on this thread (or carried to it, below), or
// null.
TensorStash* current_stash();

// While alive, this thread's stash is the stash of every thread that runs
// under an at::ThreadLocalState captured meanwhile and installs none of its
// own (sac/dispatch/internal/carried.h): the autograd engine's device threads, for a
// backward called under the stash.
class CarryStash {
 public:
  CarryStash();
  ~CarryStash();
  CarryStash(const CarryStash&) = delete;
  CarryStash& operator=(const CarryStash&) = delete;

 private:
  struct Carry;
  std::unique_ptr<Carry> carry_;
};

// Installs `stash` on this thread for the scope's lifetime.
class StashScope {
 public:
  explicit StashScope(std::shared_ptr<TensorStash> stash);
  ~StashScope();
  StashScope(const StashScope&) = delete;
  StashScope& operator=(const StashScope&) = delete;

 private:
  std::shared_ptr<TensorStash> stash_;
  TensorStash* outer_;
};

}  // namespace sac::detail
