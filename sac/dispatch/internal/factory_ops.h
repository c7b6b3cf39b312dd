// The ops that per-op kernels miss: those behind LibTorch's torch:: factory
// functions (factory_ops.cpp, Note [The factory ops are a list]).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <vector>

namespace sac::detail {

// Whether per-op kernels miss calls of `op`: the factory ops (zeros, full,
// arange, randn, empty, the *_like ones, ...: the overloads with
// TensorOptions) that LibTorch's torch:: factory functions (torch::zeros,
// torch::randn_like, ...) call with ADInplaceOrView excluded, so that a
// kernel there never runs. The same ops called as at::zeros are seen. The
// fallback key sees every call.
bool per_op_kernels_miss(const c10::OperatorHandle& op);

// The names of those factory ops (Note [The factory ops are a list]).
const std::vector<const char*>& listed_factory_ops();

}  // namespace sac::detail
