// The ops per-op kernels miss: those behind LibTorch's torch:: factory
// functions.
#include <sac/dispatch/internal/factory_ops.h>

#include <string>
#include <unordered_set>
#include <vector>

namespace sac::detail {

// Note [The factory ops are a list]
// torch::zeros, torch::randn_like and the other functions of LibTorch's
// torch/csrc/autograd/generated/variable_factories.h call their aten op with
// ADInplaceOrView excluded, so a per-op kernel there never runs. torchgen
// writes such a function for every op with a function variant whose schema
// takes TensorOptions (dtype, layout, device, pin_memory) or whose name ends
// in _like. c10 has neither a tag for these ops nor the variants in the
// schema (new_empty takes TensorOptions too, but is a method, and its calls
// reach the kernel), so the names are listed, from LibTorch's header,
// and the schema decides the overload: the one with a `dtype` argument.
const std::vector<const char*>& listed_factory_ops() {
  // The aten ops behind torch::'s factory functions (LibTorch's
  // torch/csrc/autograd/generated/variable_factories.h, the same in 2.13,
  // 2.14 and 2.15), whose overloads with TensorOptions (a `dtype` argument)
  // those functions call. Not aten::_to_copy: its ordinary caller,
  // Tensor::to, is seen. tests/contract_test.cpp checks the list against the
  // schemas the running torch registers.
  static const std::vector<const char*> names{
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
      "aten::_empty_per_channel_affine_quantized",
      "aten::_make_dep_token",
      "aten::_sparse_bsc_tensor_unsafe",
      "aten::_sparse_bsr_tensor_unsafe",
      "aten::_sparse_compressed_tensor_unsafe",
      "aten::_sparse_compressed_tensor_with_dims",
      "aten::_sparse_coo_tensor_unsafe",
      "aten::_sparse_coo_tensor_with_dims",
      "aten::_sparse_coo_tensor_with_dims_and_tensors",
      "aten::_sparse_csc_tensor_unsafe",
      "aten::_sparse_csr_tensor_unsafe",
  };
  return names;
}

bool per_op_kernels_miss(const c10::OperatorHandle& op) {
  static const std::unordered_set<std::string> factories(listed_factory_ops().begin(),
                                                         listed_factory_ops().end());
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

}  // namespace sac::detail
