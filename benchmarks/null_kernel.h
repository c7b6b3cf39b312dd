// The null kernel: a boxed kernel at sac's dispatch level that does
// nothing but redispatch below itself. Whatever it adds to an op call, any
// kernel placed there pays; the per-op benchmarks state sac's added cost as a
// multiple of it.
//
// It must be placed before sac chooses its mechanism: choosing the fallback
// mechanism registers sac's own fallback on the same key. So the mechanism
// is read from SAC_DISPATCH, which benchmarks/run.sh always sets, without
// asking sac.
#pragma once

#include <sac/dispatch/internal/interceptor.h>
#include <sac/dispatch/internal/registry.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <optional>
#include <string>

namespace sac_benchmarks {

// The mechanism SAC_DISPATCH names; it must name one.
inline sac::dispatch::Mechanism mechanism_from_environment() {
  const char* env = std::getenv("SAC_DISPATCH");
  const std::string value = env == nullptr ? "" : env;
  TORCH_CHECK(value == "per_op" || value == "fallback",
              "the null kernel needs SAC_DISPATCH=per_op or SAC_DISPATCH=fallback, found '", value,
              "': it must sit where sac's kernel will, before sac chooses");
  return value == "per_op" ? sac::dispatch::Mechanism::PerOpKernels
                           : sac::dispatch::Mechanism::FallbackKey;
}

template <c10::DispatchKey Key>
void do_nothing_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                       torch::jit::Stack* stack) {
  op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, Key), stack);
}

// While alive, calls of `op` pass through the do-nothing kernel: a kernel for
// the op on ADInplaceOrView (per-op mechanism), or a fallback on the Fake key
// with the key included on this thread (fallback mechanism), as sac places
// its own.
class NullKernel {
 public:
  explicit NullKernel(const c10::OperatorName& op) {
    const auto mechanism = mechanism_from_environment();
    const c10::DispatchKey key = sac::detail::interception_key(mechanism);
    auto& dispatcher = c10::Dispatcher::singleton();
    if (mechanism == sac::dispatch::Mechanism::PerOpKernels) {
      TORCH_CHECK(key == c10::DispatchKey::ADInplaceOrView,
                  "sac's per-op key moved; update the null kernel");
      registration_.emplace(
          dispatcher.registerImpl(op, key,
                                  c10::KernelFunction::makeFromBoxedFunction<
                                      &do_nothing_kernel<c10::DispatchKey::ADInplaceOrView>>(),
                                  std::nullopt, nullptr, "sac benchmark null kernel"));
    } else {
      TORCH_CHECK(key == c10::DispatchKey::Fake,
                  "sac's fallback key moved; update the null kernel");
      registration_.emplace(dispatcher.registerFallback(
          key,
          c10::KernelFunction::makeFromBoxedFunction<&do_nothing_kernel<c10::DispatchKey::Fake>>(),
          "sac benchmark null kernel"));
      included_.emplace(key);
    }
  }

 private:
  std::optional<c10::RegistrationHandleRAII> registration_;
  std::optional<c10::impl::IncludeDispatchKeyGuard> included_;
};

}  // namespace sac_benchmarks
