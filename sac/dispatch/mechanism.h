// Where sac's interception sits in the c10 dispatcher: below autograd, one
// of two ways, chosen once per process.
//
// Two mechanisms place the same boxed kernel right below autograd:
//
//   * `Mechanism::PerOpKernels` registers a kernel on `ADInplaceOrView` for
//     each op an interceptor needs. ADInplaceOrView is a fallthrough for
//     functional ops, so the kernel sits there. It works on
//     every LibTorch; ops that core already gives an ADInplaceOrView kernel
//     (views, in-place and out= ops) can never be intercepted this way.
//   * `Mechanism::FallbackKey` registers one boxed fallback on the
//     out-of-core `Fake` functionality key, which sits below autograd and which
//     LibTorch 2.13 leaves unused. Every op dispatched on a thread with an
//     active interceptor reaches it.
//
// The mechanism is chosen once per process, on first use: `set_mechanism`, else
// the environment variable `SAC_DISPATCH` (`per_op`, `fallback` or `auto`),
// else `auto` (the fallback key when it is free, per-op kernels otherwise).
// sac never replaces or shadows a kernel LibTorch registered: where that would
// be needed, it throws instead.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DispatchKey.h>

#include <optional>
#include <string>
#include <string_view>

namespace sac::dispatch {

// How intercepting kernels are placed in the dispatcher.
enum class Mechanism {
  PerOpKernels,  // a kernel on ADInplaceOrView for each op that is needed
  FallbackKey,   // one boxed fallback on DispatchKey::Fake
};

std::string_view to_string(Mechanism mechanism);

// The dispatch key where `mechanism` places sac's kernel. A do-nothing kernel
// on the same key is the floor that any interception there pays
// (benchmarks/floor.h).
c10::DispatchKey interception_key(Mechanism mechanism);

// Selects the mechanism for this process. `std::nullopt` means automatic.
// Throws if a different mechanism is already in use (interception happened),
// or if `FallbackKey` is asked for but the key is taken.
void set_mechanism(std::optional<Mechanism> mechanism);

// The mechanism in use, choosing it (from `SAC_DISPATCH`, else automatically)
// if nothing has been intercepted yet. Throws on a bad `SAC_DISPATCH` value or
// if the requested mechanism is unavailable.
Mechanism mechanism();

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

// per_op_kernels_miss(op) when the mechanism in use is PerOpKernels.
bool mechanism_misses(const c10::OperatorHandle& op);

}  // namespace sac::dispatch
