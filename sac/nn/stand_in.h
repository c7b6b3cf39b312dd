// sac::detail::StandIn: the part of sac's module wrappers that makes a
// wrapper *be* the module it wraps, for everything but forward.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>

#include <memory>
#include <ostream>
#include <string>

namespace sac::detail {

// A module that stands in for another: it holds `module` and registers the
// module's own parameters, buffers and children as its own, under the same
// names, and passes train(), to() and printing on to it. Everything about
// "being the module" lives here; the wrappers add only their forward.
class StandIn : public torch::nn::Module {
 public:
  void train(bool on = true) override;
  bool is_training() const noexcept override;
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;
  void pretty_print(std::ostream& stream) const override;

 protected:
  StandIn(std::shared_ptr<torch::nn::Module> module, std::string kind);

 private:
  std::shared_ptr<torch::nn::Module> module_;
  std::string kind_;  // for printing: "sac::CheckpointWrapper"
};

}  // namespace sac::detail
