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

#include <optional>
#include <string_view>

namespace sac::dispatch {

// How intercepting kernels are placed in the dispatcher.
enum class Mechanism {
  PerOpKernels,  // a kernel on ADInplaceOrView for each op that is needed
  FallbackKey,   // one boxed fallback on DispatchKey::Fake
};

std::string_view to_string(Mechanism mechanism);

// Selects the mechanism for this process. `std::nullopt` means automatic.
// Throws if a different mechanism is already in use (interception happened),
// or if `FallbackKey` is asked for but the key is taken.
void set_mechanism(std::optional<Mechanism> mechanism);

// The mechanism in use, choosing it (from `SAC_DISPATCH`, else automatically)
// if nothing has been intercepted yet. Throws on a bad `SAC_DISPATCH` value or
// if the requested mechanism is unavailable.
Mechanism mechanism();

}  // namespace sac::dispatch
