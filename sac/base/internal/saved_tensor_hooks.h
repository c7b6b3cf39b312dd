// Saved-tensor hooks in pure C++.
//
// PyTorch's `torch.autograd.graph.saved_tensors_hooks` lives in Python. In
// C++, every SavedVariable asks the default autograd engine for hooks, and the
// base engine has none. sac installs, once per process, an engine that
// differs from the base engine only in answering that question from a
// thread-local stack of hook factories. In a process where Python already
// installed its own engine, installing another would break Python, so sac
// refuses with a CheckpointError instead.
#pragma once

#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <functional>
#include <memory>

namespace sac::detail {

// Makes the hooks for one tensor autograd is about to save.
using SavedTensorHooksFactory =
    std::function<std::unique_ptr<torch::autograd::SavedVariableHooks>()>;

// Installs sac's engine if it is not the default engine yet. Throws a
// CheckpointError if another non-base engine (Python's) is the default.
void install_hooking_engine();

// While alive, tensors that autograd saves on this thread get hooks from
// `factory` (the innermost guard wins).
class SavedTensorHooksGuard {
 public:
  explicit SavedTensorHooksGuard(SavedTensorHooksFactory factory);
  ~SavedTensorHooksGuard();
  SavedTensorHooksGuard(const SavedTensorHooksGuard&) = delete;
  SavedTensorHooksGuard& operator=(const SavedTensorHooksGuard&) = delete;
};

// Saves `t` as autograd saves an input (SavedVariable(t, false)), without the
// thread's hooks: what is saved is kept, not handed to a region's holders.
// Kept where the thread keeps such tensors: in its stash if it has one
// (sac/base/internal/stash.h), as the thread's hooks would for autograd.
torch::autograd::SavedVariable save_kept(const at::Tensor& t);

}  // namespace sac::detail
