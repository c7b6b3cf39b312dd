// Saved-tensor hooks in pure C++.
//
// PyTorch's `torch.autograd.graph.saved_tensors_hooks` lives in Python. In
// C++, every SavedVariable asks the default autograd engine for hooks, and the
// base engine has none. sac installs, once per process, an engine that
// differs from the base engine only in answering that question from a
// thread-local stack of hook factories. In a process where Python already
// installed its own engine, installing another would break Python: there
// sac's hooks reach autograd through a bridge (below) that the Python module
// sets, and without one sac refuses with a CheckpointError.
#pragma once

#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <functional>
#include <memory>

namespace sac::detail {

// Makes the hooks for one tensor autograd is about to save.
using SavedTensorHooksFactory =
    std::function<std::unique_ptr<torch::autograd::SavedVariableHooks>()>;

// Installs sac's engine if it is not the default engine yet and no bridge
// is set. Throws a CheckpointError if another non-base engine (Python's) is
// the default and no bridge is set.
void install_hooking_engine();

// Hands sac's hooks to an engine that asks someone else for them: Python's
// engine asks torch's own stack of saved_tensors_hooks, so the Python module
// pushes a pack and unpack hook there for each of sac's guards. push() and pop()
// come on the thread of the guard, in stack order.
class SavedTensorHooksBridge {
 public:
  virtual ~SavedTensorHooksBridge() = default;
  // Until the matching pop(), tensors autograd saves on this thread get
  // hooks from `factory` (which may make none: saved as usual).
  virtual void push(SavedTensorHooksFactory factory) = 0;
  virtual void pop() = 0;
  // While hidden, autograd saves on this thread without any hooks; nests.
  virtual void hide() = 0;
  virtual void show() = 0;
};

// Sets the bridge for the life of the process (it is never deleted), before
// any of sac's guards. sac's own engine is then never installed; setting a
// bridge after it was is an error.
void set_saved_tensor_hooks_bridge(SavedTensorHooksBridge* bridge);

// While alive, tensors that autograd saves on this thread get hooks from
// `factory` (the innermost guard wins).
class SavedTensorHooksGuard {
 public:
  explicit SavedTensorHooksGuard(SavedTensorHooksFactory factory);
  ~SavedTensorHooksGuard();
  SavedTensorHooksGuard(const SavedTensorHooksGuard&) = delete;
  SavedTensorHooksGuard& operator=(const SavedTensorHooksGuard&) = delete;

 private:
  SavedTensorHooksBridge* bridge_;  // or nullptr: sac's engine asks
};

// Saves `t` as autograd saves an input (SavedVariable(t, false)), without the
// thread's hooks: what is saved stays with autograd, not handed to a
// region's holders. Kept where the thread keeps such tensors: in its stash
// if it has one
// (sac/base/internal/stash.h), as the thread's hooks would for autograd.
torch::autograd::SavedVariable save_unhooked(const at::Tensor& t);

// Whether autograd makes `t` a new grad_fn the next time anyone asks for it:
// a view whose base (or another of its views) was modified in place since
// its grad_fn was made (c10 contract, "View grad_fn rebuilt on demand").
bool grad_fn_is_stale(const at::Tensor& t);

// Saves `t` as autograd saves an input (SavedVariable(t, false)), with the
// thread's hooks (an enclosing region's holders, an offload guard's copies).
// Note [Saving a stale view]: hooks make the SavedVariable ask for `t`'s
// grad_fn, and a stale view's is made then, numbered (sequence_nr) by when
// it is asked for. Without checkpointing it is made where the program first
// uses the view; made earlier, it sorts otherwise among the nodes ready in
// backward, which then sums the view's gradients in another order (bits
// apart, found by the fuzzer). A stale view is saved without hooks: kept as
// it is, as PyTorch's checkpoint keeps its arguments. The hooks still pack
// it once (what they keep is dropped): an enclosing region counts the
// tensors it packs, and in its recomputation the view is no longer stale.
torch::autograd::SavedVariable save_input(const at::Tensor& t);

}  // namespace sac::detail
