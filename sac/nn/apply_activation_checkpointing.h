// sac::apply_activation_checkpointing: checkpoint chosen submodules of a model
// in place, without touching the model's code.
//
//   sac::apply_activation_checkpointing(model, sac::modules_of_type<BlockImpl>(), options);
//   auto loss = model->forward(tokens);  // each Block's forward is checkpointed
//
// PyTorch's apply_activation_checkpointing(model, checkpoint_wrapper_fn,
// check_fn). In Python any attribute can be replaced by a wrapper; in C++ a
// parent calls its child's forward either type-erased, through
// torch::nn::AnyModule (torch::nn::Sequential does), or through the child's own
// type (`block->forward(x)` on a typed member, `list[i]->as<BlockImpl>()` on a
// ModuleList or ModuleDict entry). Only the first can be redirected from
// outside: C++ forward methods are not virtual.
//
// So each chosen module must be an entry of a torch::nn::Sequential, at any
// depth of the model (a Sequential member of a user module, a Sequential in a
// ModuleList: all fine). It is replaced there by a
// sac::CheckpointWrapper<torch::nn::AnyModule> (a tensor in, a tensor out),
// under its own name, so parameter and buffer names do not change. A chosen
// module anywhere else is an error that names it, says where it is held, and
// what to write instead; the model is then left exactly as it was.
#pragma once

#include <sac/checkpoint/options.h>

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace sac {

// Chooses the modules to checkpoint: called with each submodule's qualified
// name ("blocks.3", as named_modules() gives it) and the module. Never
// called for the root.
using ModulePredicate =
    std::function<bool(const std::string& qualified_name, const torch::nn::Module& module)>;

// Wraps, in place, every submodule of `model` for which `predicate` holds
// (nested ones too: a chosen module inside another chosen one is checkpointed
// inside the outer checkpoint, as in PyTorch). Each wrapper's options name
// its region by the module's qualified name (unless they name it already).
// Without options, the wrappers use the innermost CheckpointScope's options
// at the time of each forward.
// Returns the number of modules wrapped. Throws c10::Error, changing nothing,
// if a chosen module is not an entry of a torch::nn::Sequential.
int64_t apply_activation_checkpointing(const std::shared_ptr<torch::nn::Module>& model,
                                       const ModulePredicate& predicate,
                                       std::optional<CheckpointOptions> options = std::nullopt);

// The same for a module holder (torch::nn::Sequential, a user's Model).
template <class Impl>
int64_t apply_activation_checkpointing(const torch::nn::ModuleHolder<Impl>& model,
                                       const ModulePredicate& predicate,
                                       std::optional<CheckpointOptions> options = std::nullopt) {
  return apply_activation_checkpointing(std::static_pointer_cast<torch::nn::Module>(model.ptr()),
                                        predicate, std::move(options));
}

// A predicate choosing the modules of type `Impl` (PyTorch's
// `check_fn=lambda m: isinstance(m, Block)`).
template <class Impl>
ModulePredicate modules_of_type() {
  return [](const std::string&, const torch::nn::Module& module) {
    return dynamic_cast<const Impl*>(&module) != nullptr;
  };
}

}  // namespace sac
