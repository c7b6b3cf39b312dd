// sac::OffloadWrapper: a torch::nn module whose forward runs under
// sac::OffloadGuard (PyTorch's offload_wrapper).
//
//   auto block = sac::offload_wrapper(Block(config));
//   auto both = sac::offload_wrapper(sac::checkpoint_wrapper(Block(config), options));
//
// What autograd saves in the module's forward, and what checkpoints inside it
// keep, waits for backward in host memory. The module's own parameters and
// buffers are never copied: they stay on the device anyway. Like
// sac::CheckpointWrapper, the wrapper has the module's parameter and buffer
// names and state (sac/nn/stand_in.h).
#pragma once

#include <sac/nn/stand_in.h>
#include <sac/offload/offload.h>

#include <torch/nn/pimpl.h>

#include <memory>
#include <utility>

namespace sac {

template <class Impl>
class OffloadWrapperImpl : public detail::StandIn {
 public:
  explicit OffloadWrapperImpl(std::shared_ptr<Impl> module,
                              OffloadOptions options = OffloadOptions())
      : StandIn(module, "sac::OffloadWrapper"),
        module_(std::move(module)),
        options_(std::move(options)) {}

  template <class... Args>
  auto forward(Args&&... args) {
    OffloadGuard offload(
        OffloadOptions(options_).leave_in_place(parameters()).leave_in_place(buffers()));
    return module_->forward(std::forward<Args>(args)...);
  }

  const std::shared_ptr<Impl>& module() const { return module_; }
  const OffloadOptions& options() const { return options_; }

 private:
  std::shared_ptr<Impl> module_;
  OffloadOptions options_;
};

template <class Impl>
class OffloadWrapper : public torch::nn::ModuleHolder<OffloadWrapperImpl<Impl>> {
 public:
  using torch::nn::ModuleHolder<OffloadWrapperImpl<Impl>>::ModuleHolder;
};

template <class Impl>
OffloadWrapper<Impl> offload_wrapper(std::shared_ptr<Impl> module,
                                     OffloadOptions options = OffloadOptions()) {
  return OffloadWrapper<Impl>(std::move(module), std::move(options));
}
template <class Impl>
OffloadWrapper<Impl> offload_wrapper(const torch::nn::ModuleHolder<Impl>& module,
                                     OffloadOptions options = OffloadOptions()) {
  return offload_wrapper(module.ptr(), std::move(options));
}

}  // namespace sac
