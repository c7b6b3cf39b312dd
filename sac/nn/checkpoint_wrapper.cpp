#include <sac/nn/checkpoint_wrapper.h>

#include <c10/util/Exception.h>

namespace sac {

CheckpointWrapperImpl<torch::nn::AnyModule>::CheckpointWrapperImpl(
    torch::nn::AnyModule module, std::optional<CheckpointOptions> options)
    : StandIn(module.is_empty() ? nullptr : module.ptr(), "sac::CheckpointWrapper"),
      module_(std::make_shared<torch::nn::AnyModule>(std::move(module))),
      options_(std::move(options)) {}

at::Tensor CheckpointWrapperImpl<torch::nn::AnyModule>::forward(at::Tensor input) {
  return sac::checkpoint(
      detail::options_or_scoped(options_, region_name_),
      [module = module_](const at::Tensor& x) {
        auto output = module->any_forward(x);
        const at::Tensor* tensor = output.try_get<at::Tensor>();
        TORCH_CHECK(tensor != nullptr, "sac::CheckpointWrapper: the wrapped ",
                    module->ptr()->name(), " returned a ", c10::demangle(output.type_info().name()),
                    "; a type-erased wrapper (as apply_activation_checkpointing puts "
                    "into a Sequential) takes one tensor and returns one. Wrap "
                    "this module as sac::CheckpointWrapper<",
                    module->ptr()->name(), "> instead.");
        return *tensor;
      },
      std::move(input));
}

std::shared_ptr<torch::nn::Module> CheckpointWrapperImpl<torch::nn::AnyModule>::clone(
    const std::optional<torch::Device>& device) const {
  auto copy = std::make_shared<CheckpointWrapperImpl>(module_->clone(device), options_);
  copy->set_region_name(region_name_);
  return copy;
}

}  // namespace sac
