// sac::CheckpointWrapper: a torch::nn module whose forward is checkpointed.
//
//   auto block = sac::checkpoint_wrapper(Block(config), options);
//   auto y = block->forward(x, mask);  // Block's forward, under sac::checkpoint
//
// PyTorch's `checkpoint_wrapper(module)` and the composable
// `checkpoint(module)`: the wrapper runs the module's forward through
// sac::checkpoint and otherwise *is* the module. It registers the module's own
// parameters, buffers and children under their own names, so the wrapped and
// the unwrapped module have the same named_parameters(), named_buffers() and
// state: an optimizer built on either works on both, and torch::save of one
// loads into the other. train(), eval(), to() and zero_grad() reach the
// module.
//
// Why sac::checkpoint and not a CheckpointRegion guard around forward: a
// region records every op, which only the fallback dispatch mechanism sees;
// the wrapper works under both (see sac/checkpoint/region.h).
//
// The state is the module's as it is when wrapped: a module that registers
// new parameters later (reset(), a lazy module) must be wrapped after that.
#pragma once

#include <sac/base/returned.h>
#include <sac/checkpoint/checkpoint.h>
#include <sac/checkpoint/options.h>
#include <sac/checkpoint/scope.h>
#include <sac/nn/stand_in.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace sac {
namespace detail {

// The options a wrapper's forward uses: its own, or else the innermost
// CheckpointScope's on this thread at the time of the forward; named `name`
// (the module's qualified name) where they name no region.
inline CheckpointOptions options_or_scoped(const std::optional<CheckpointOptions>& own,
                                           const std::string& name = std::string()) {
  CheckpointOptions options = own.has_value() ? *own : scoped_options();
  if (options.name().empty() && !name.empty()) {
    options.name(name);
  }
  return options;
}

class CheckpointWrapperBase;

// The thread's sac::fit run (sac/nn/fit.h), which each wrapper's forward
// asks: while sac::fit runs a step, the wrappers' regions run with the
// options it gives, and hand it what profiles them.
class FitSession {
 public:
  // The session on this thread, or null.
  static FitSession* active();
  // `wrapper`'s forward begins, with `options`; `run` runs its region (the
  // module's forward on these arguments, plain) and returns its outputs.
  // Returns the options to checkpoint it with.
  virtual CheckpointOptions region(CheckpointWrapperBase& wrapper, CheckpointOptions options,
                                   const std::function<std::vector<at::Tensor>()>& run) = 0;

 protected:
  // Makes this the thread's session while it lives.
  FitSession();
  virtual ~FitSession();
  FitSession(const FitSession&) = delete;
  FitSession& operator=(const FitSession&) = delete;

 private:
  FitSession* outer_;
};

// What every checkpoint wrapper is, whatever it wraps: its options, and
// the options of each forward.
class CheckpointWrapperBase : public StandIn {
 public:
  // The options of this wrapper's checkpoints; nullopt: the scope's.
  const std::optional<CheckpointOptions>& options() const { return options_; }
  void set_options(std::optional<CheckpointOptions> options) { options_ = std::move(options); }
  // The name its regions get when their options name none (the scope's
  // options too): apply_activation_checkpointing gives the module's
  // qualified name, so errors say "region `blocks.3`".
  const std::string& region_name() const { return region_name_; }
  void set_region_name(std::string name) { region_name_ = std::move(name); }
  // What the wrapper checkpoints, for people: the name its options give
  // its regions, else its region name, else the module's (BlockImpl).
  std::string region_label() const;

 protected:
  CheckpointWrapperBase(std::shared_ptr<torch::nn::Module> module,
                        std::optional<CheckpointOptions> options);

  // The options of a forward: its own or the scope's, named by its region
  // name where they name no region; under sac::fit, the session's, given
  // `region` (which returns the module's outputs) to profile.
  template <class Region>
  CheckpointOptions forward_options(Region&& region) {
    CheckpointOptions options = options_or_scoped(options_, region_name_);
    if (FitSession* session = FitSession::active()) {
      return session->region(*this, std::move(options), [&] {
        std::vector<at::Tensor> outputs;
        collect_returned(region(), outputs);
        return outputs;
      });
    }
    return options;
  }

 private:
  std::optional<CheckpointOptions> options_;
  std::string region_name_;
  std::string module_name_;
};

}  // namespace detail

// Wraps a module of type `Impl` (torch::nn::LinearImpl, a user's BlockImpl).
// forward(args...) takes whatever Impl::forward takes (default arguments and
// overloads included) and returns what it returns. Tensor arguments are saved
// as sac::checkpoint saves them; other arguments are copied and kept until
// backward.
template <class Impl>
class CheckpointWrapperImpl : public detail::CheckpointWrapperBase {
 public:
  CheckpointWrapperImpl(std::shared_ptr<Impl> module,
                        std::optional<CheckpointOptions> options = std::nullopt)
      : CheckpointWrapperBase(module, std::move(options)), module_(std::move(module)) {}

  template <class... Args>
  auto forward(Args&&... args) {
    return sac::checkpoint(
        forward_options([&] { return module_->forward(args...); }),
        [module = module_](auto&&... a) {
          return module->forward(std::forward<decltype(a)>(a)...);
        },
        std::forward<Args>(args)...);
  }

  // A deep copy: the clone wraps a clone of the module, with the same options.
  std::shared_ptr<torch::nn::Module> clone(
      const std::optional<torch::Device>& device = std::nullopt) const override {
    auto module = std::dynamic_pointer_cast<Impl>(module_->clone(device));
    auto copy = std::make_shared<CheckpointWrapperImpl>(std::move(module), options());
    copy->set_region_name(region_name());
    return copy;
  }

  const std::shared_ptr<Impl>& module() const { return module_; }

 private:
  std::shared_ptr<Impl> module_;
};

// A type-erased module (an entry of torch::nn::Sequential) taking and
// returning one tensor, as Sequential chains them. This is what
// sac::apply_activation_checkpointing puts into a Sequential; its forward has
// one signature, so it can itself be an AnyModule.
template <>
class CheckpointWrapperImpl<torch::nn::AnyModule> : public detail::CheckpointWrapperBase {
 public:
  explicit CheckpointWrapperImpl(torch::nn::AnyModule module,
                                 std::optional<CheckpointOptions> options = std::nullopt);

  // Throws, naming the module, if its forward does not take one tensor or
  // does not return one.
  at::Tensor forward(at::Tensor input);

  std::shared_ptr<torch::nn::Module> clone(
      const std::optional<torch::Device>& device = std::nullopt) const override;

  torch::nn::AnyModule& module() const { return *module_; }

 private:
  std::shared_ptr<torch::nn::AnyModule> module_;
};

// The holder, in the C++ frontend's idiom (a TORCH_MODULE-style handle):
// sac::CheckpointWrapper<BlockImpl> holds a CheckpointWrapperImpl<BlockImpl>.
template <class Impl>
class CheckpointWrapper : public torch::nn::ModuleHolder<CheckpointWrapperImpl<Impl>> {
 public:
  using torch::nn::ModuleHolder<CheckpointWrapperImpl<Impl>>::ModuleHolder;
};

// Wraps `module` (a holder such as torch::nn::Linear or a user's Block, or a
// std::shared_ptr to its Impl). Without options, each forward uses the
// innermost CheckpointScope's options, or the defaults (full recomputation).
template <class Impl>
CheckpointWrapper<Impl> checkpoint_wrapper(
    std::shared_ptr<Impl> module, std::optional<CheckpointOptions> options = std::nullopt) {
  return CheckpointWrapper<Impl>(std::move(module), std::move(options));
}
template <class Impl>
CheckpointWrapper<Impl> checkpoint_wrapper(
    const torch::nn::ModuleHolder<Impl>& module,
    std::optional<CheckpointOptions> options = std::nullopt) {
  return checkpoint_wrapper(module.ptr(), std::move(options));
}
inline CheckpointWrapper<torch::nn::AnyModule> checkpoint_wrapper(
    torch::nn::AnyModule module, std::optional<CheckpointOptions> options = std::nullopt) {
  return CheckpointWrapper<torch::nn::AnyModule>(std::move(module), std::move(options));
}

}  // namespace sac
