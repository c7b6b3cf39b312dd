// Where each mechanism places sac's kernel, and which op calls it cannot
// see: what the floors, tests and benchmarks ask of a mechanism beyond
// choosing it (sac/dispatch/mechanism.h).
#pragma once

#include <sac/dispatch/mechanism.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DispatchKey.h>

#include <string>
#include <vector>

namespace sac::detail {

// The dispatch key where `mechanism` places sac's kernel. A do-nothing kernel
// on the same key is the least that any interception there costs
// (benchmarks/null_kernel.h).
c10::DispatchKey interception_key(dispatch::Mechanism mechanism);

// Whether the `Fake` key is free for sac's fallback in this process: no
// fallback and no per-op kernel registered on it by anyone else. When it is
// not, `reason` (if given) says why.
bool fallback_key_available(std::string* reason = nullptr);

// Whether per-op kernels miss calls of `op`: the factory ops (zeros, full,
// arange, randn, empty, the *_like ones, ...: the overloads with
// TensorOptions) that LibTorch's torch:: factory functions (torch::zeros,
// torch::randn_like, ...) call with ADInplaceOrView excluded, so that a
// kernel there never runs. The same ops called as at::zeros are seen. The
// fallback key sees every call.
bool per_op_kernels_miss(const c10::OperatorHandle& op);

// The names of those factory ops (Note [The factory ops are a list]).
const std::vector<const char*>& listed_factory_ops();

// per_op_kernels_miss(op) when the mechanism in use is PerOpKernels.
bool mechanism_misses(const c10::OperatorHandle& op);

}  // namespace sac::detail
