#include <sac/nn/checkpoint_wrapper.h>

#include <c10/util/Exception.h>

namespace sac {

namespace detail {
namespace {

thread_local FitSession* tls_fit_session = nullptr;

// The one tensor a type-erased module returns.
at::Tensor only_tensor(torch::nn::AnyModule& module, const at::Tensor& input) {
  auto output = module.any_forward(input);
  const at::Tensor* tensor = output.try_get<at::Tensor>();
  TORCH_CHECK(tensor != nullptr, "sac::CheckpointWrapper: the wrapped ", module.ptr()->name(),
              " returned a ", c10::demangle(output.type_info().name()),
              "; a type-erased wrapper (as apply_activation_checkpointing puts "
              "into a Sequential) takes one tensor and returns one. Wrap "
              "this module as sac::CheckpointWrapper<",
              module.ptr()->name(), "> instead.");
  return *tensor;
}

}  // namespace

FitSession* FitSession::active() { return tls_fit_session; }

FitSession::FitSession() : outer_(tls_fit_session) { tls_fit_session = this; }

FitSession::~FitSession() { tls_fit_session = outer_; }

CheckpointWrapperBase::CheckpointWrapperBase(std::shared_ptr<torch::nn::Module> module,
                                             std::optional<CheckpointOptions> options)
    : StandIn(module, "sac::CheckpointWrapper"),
      options_(std::move(options)),
      module_name_(module->name()) {}

std::string CheckpointWrapperBase::region_label() const {
  if (options_.has_value() && !options_->name().empty()) return options_->name();
  return region_name_.empty() ? module_name_ : region_name_;
}

}  // namespace detail

CheckpointWrapperImpl<torch::nn::AnyModule>::CheckpointWrapperImpl(
    torch::nn::AnyModule module, std::optional<CheckpointOptions> options)
    : CheckpointWrapperBase(module.is_empty() ? nullptr : module.ptr(), std::move(options)),
      module_(std::make_shared<torch::nn::AnyModule>(std::move(module))) {}

at::Tensor CheckpointWrapperImpl<torch::nn::AnyModule>::forward(at::Tensor input) {
  return sac::checkpoint(
      forward_options([&] { return detail::only_tensor(*module_, input); }),
      [module = module_](const at::Tensor& x) { return detail::only_tensor(*module, x); },
      std::move(input));
}

std::shared_ptr<torch::nn::Module> CheckpointWrapperImpl<torch::nn::AnyModule>::clone(
    const std::optional<torch::Device>& device) const {
  auto copy = std::make_shared<CheckpointWrapperImpl>(module_->clone(device), options());
  copy->set_region_name(region_name());
  return copy;
}

}  // namespace sac
