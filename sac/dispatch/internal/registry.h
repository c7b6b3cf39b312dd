// Note [The registry]
//
// What the process shares about interception (registry.cpp): the mechanism
// in use, chosen once, where it places the kernel, and the kernels it placed
// in the dispatcher, one fallback or a kernel per op. The interceptor (interceptor.cpp) is the
// kernel and each thread's state; the registry places it.
#pragma once

#include <sac/dispatch/mechanism.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DispatchKey.h>
#include <c10/core/DispatchKeySet.h>

#include <string>

namespace sac::detail {

// The keys the two mechanisms place the kernel at.
constexpr c10::DispatchKey kFallbackKey = c10::DispatchKey::Fake;
constexpr c10::DispatchKey kPerOpKey = c10::DispatchKey::ADInplaceOrView;

// The one boxed kernel, at `Key` (interceptor.cpp, instantiated for both).
template <c10::DispatchKey Key>
void intercepting_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                         torch::jit::Stack* stack);

// Whether sac's own fallback is registered on kFallbackKey (once it is, it
// stays).
bool own_fallback_registered();

// Fixes the mechanism on first use and places the kernels of ops defined
// since the last call: before an interceptor or observer becomes active.
void activate_interception();

// The dispatch key where `mechanism` places sac's kernel. A do-nothing kernel
// on the same key is the least that any interception there costs
// (benchmarks/null_kernel.h).
c10::DispatchKey interception_key(dispatch::Mechanism mechanism);

// Whether the `Fake` key is free for sac's fallback in this process: no
// fallback and no per-op kernel registered on it by anyone else. When it is
// not, `reason` (if given) says why.
bool fallback_key_available(std::string* reason = nullptr);

// per_op_kernels_miss(op) when the mechanism in use is PerOpKernels.
bool mechanism_misses(const c10::OperatorHandle& op);

}  // namespace sac::detail
