#include <sac/nn/checkpoint_wrapper.h>

#include <c10/util/Exception.h>

namespace sac {
namespace detail {

StandIn::StandIn(std::shared_ptr<torch::nn::Module> module, std::string kind)
    : module_(std::move(module)), kind_(std::move(kind)) {
  TORCH_CHECK(module_ != nullptr, kind_, ": got no module to wrap (an empty holder).");
  // The same tensors and modules under the same names: the wrapper's state
  // is the module's, in the order the module lists it.
  for (const auto& parameter : module_->named_parameters(/*recurse=*/false)) {
    register_parameter(parameter.key(), parameter.value(),
                       parameter.value().requires_grad());
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
void StandIn::to(torch::Device device, bool non_blocking) {
  module_->to(device, non_blocking);
}

void StandIn::pretty_print(std::ostream& stream) const {
  stream << kind_ << "(";
  module_->pretty_print(stream);
  stream << ")";
}

}  // namespace detail

CheckpointWrapperImpl<torch::nn::AnyModule>::CheckpointWrapperImpl(
    torch::nn::AnyModule module, std::optional<CheckpointOptions> options)
    : StandIn(module.is_empty() ? nullptr : module.ptr(), "sac::CheckpointWrapper"),
      module_(std::make_shared<torch::nn::AnyModule>(std::move(module))),
      options_(std::move(options)) {}

at::Tensor CheckpointWrapperImpl<torch::nn::AnyModule>::forward(at::Tensor input) {
  return sac::checkpoint(
      detail::options_or_scoped(options_),
      [module = module_](const at::Tensor& x) {
        auto output = module->any_forward(x);
        const at::Tensor* tensor = output.try_get<at::Tensor>();
        TORCH_CHECK(tensor != nullptr, "sac::CheckpointWrapper: the wrapped ",
                    module->ptr()->name(), " returned a ",
                    c10::demangle(output.type_info().name()),
                    "; a type-erased wrapper (as apply_activation_checkpointing puts "
                    "into a Sequential) takes one tensor and returns one. Wrap "
                    "this module as sac::CheckpointWrapper<", module->ptr()->name(),
                    "> instead.");
        return *tensor;
      },
      std::move(input));
}

std::shared_ptr<torch::nn::Module> CheckpointWrapperImpl<torch::nn::AnyModule>::clone(
    const std::optional<torch::Device>& device) const {
  return std::make_shared<CheckpointWrapperImpl>(module_->clone(device), options_);
}

}  // namespace sac
