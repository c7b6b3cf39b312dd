// The ops per-op kernels miss: those behind LibTorch's torch:: factory
// functions.
#include <sac/dispatch/internal/placement.h>

#include <string>
#include <unordered_set>

namespace sac::dispatch {

// Note [The factory ops are a list]
// torch::zeros, torch::randn_like and the other functions of LibTorch's
// torch/csrc/autograd/generated/variable_factories.h call their aten op with
// ADInplaceOrView excluded, so a per-op kernel there never runs. torchgen
// writes such a function for every op with a function variant whose schema
// takes TensorOptions (dtype, layout, device, pin_memory) or whose name ends
// in _like. c10 has neither a tag for these ops nor the variants in the
// schema (new_empty takes TensorOptions too, but is a method, and its calls
// reach the kernel), so the names are listed, from LibTorch 2.13's header,
// and the schema decides the overload: the one with a `dtype` argument.
bool per_op_kernels_miss(const c10::OperatorHandle& op) {
  // The aten ops behind torch::'s factory functions (LibTorch 2.13's
  // torch/csrc/autograd/generated/variable_factories.h), whose overloads
  // with TensorOptions (a `dtype` argument) those functions call. Not
  // aten::_to_copy: its ordinary caller, Tensor::to, is seen.
  static const std::unordered_set<std::string> factories{
      "aten::arange",
      "aten::bartlett_window",
      "aten::blackman_window",
      "aten::empty",
      "aten::empty_like",
      "aten::empty_permuted",
      "aten::empty_quantized",
      "aten::empty_strided",
      "aten::eye",
      "aten::fft_fftfreq",
      "aten::fft_rfftfreq",
      "aten::from_file",
      "aten::full",
      "aten::full_like",
      "aten::hamming_window",
      "aten::hann_window",
      "aten::kaiser_window",
      "aten::linspace",
      "aten::logspace",
      "aten::normal",
      "aten::ones",
      "aten::ones_like",
      "aten::rand",
      "aten::rand_like",
      "aten::randint",
      "aten::randint_like",
      "aten::randn",
      "aten::randn_like",
      "aten::randperm",
      "aten::range",
      "aten::scalar_tensor",
      "aten::sparse_bsc_tensor",
      "aten::sparse_bsr_tensor",
      "aten::sparse_compressed_tensor",
      "aten::sparse_coo_tensor",
      "aten::sparse_csc_tensor",
      "aten::sparse_csr_tensor",
      "aten::tril_indices",
      "aten::triu_indices",
      "aten::zeros",
      "aten::zeros_like",
      "aten::_cudnn_init_dropout_state",
      "aten::_efficientzerotensor",
      "aten::_empty_affine_quantized",
      "aten::_empty_per_channel_affine_quantized"};
  if (factories.count(op.operator_name().name) == 0) {
    return false;
  }
  for (const auto& argument : op.schema().arguments()) {
    if (argument.name() == "dtype") {
      return true;
    }
  }
  return false;
}

}  // namespace sac::dispatch
