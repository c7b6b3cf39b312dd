#include <sac/nn/stand_in.h>

#include <c10/util/Exception.h>

#include <utility>

namespace sac::detail {

StandIn::StandIn(std::shared_ptr<torch::nn::Module> module, std::string kind)
    : module_(std::move(module)), kind_(std::move(kind)) {
  TORCH_CHECK(module_ != nullptr, kind_, ": got no module to wrap (an empty holder).");
  // The same tensors and modules under the same names: the wrapper's state
  // is the module's, in the order the module lists it.
  for (const auto& parameter : module_->named_parameters(/*recurse=*/false)) {
    register_parameter(parameter.key(), parameter.value(), parameter.value().requires_grad());
  }
  for (const auto& buffer : module_->named_buffers(/*recurse=*/false)) {
    register_buffer(buffer.key(), buffer.value());
  }
  for (const auto& child : module_->named_children()) {
    register_module(child.key(), child.value());
  }
}

bool StandIn::is_training() const noexcept { return module_->is_training(); }

void StandIn::train(bool on) {
  torch::nn::Module::train(on);
  module_->train(on);
}

// The module moves its own parameters in place (Tensor::set_data), which are
// the tensors registered here: moving the module moves the wrapper.
void StandIn::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  module_->to(device, dtype, non_blocking);
}
void StandIn::to(torch::Dtype dtype, bool non_blocking) { module_->to(dtype, non_blocking); }
void StandIn::to(torch::Device device, bool non_blocking) { module_->to(device, non_blocking); }

void StandIn::pretty_print(std::ostream& stream) const {
  stream << kind_ << "(";
  module_->pretty_print(stream);
  stream << ")";
}

}  // namespace sac::detail
