// When another library already holds the Fake key, sac refuses the fallback
// mechanism with a clear error and `auto` picks per-op kernels. Its own
// process: the key is taken before sac chooses a mechanism.
#include "support.h"

#include <sac/cache/internal/op_cache.h>
#include <sac/dispatch/internal/registry.h>
#include <sac/cache/internal/selective_modes.h>

namespace dispatch_fallback_taken_test {

void someone_elses_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                            torch::jit::Stack* stack) {
  op.redispatchBoxed(
      ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::Fake), stack);
}

TEST(FallbackKeyTaken, ForcingTheFallbackIsAnErrorAndAutoUsesPerOpKernels) {
  auto taken = c10::Dispatcher::singleton().registerFallback(
      c10::DispatchKey::Fake, c10::KernelFunction::makeFromBoxedFunction<&someone_elses_fallback>(),
      "another library");
  std::string reason;
  EXPECT_FALSE(sac::detail::fallback_key_available(&reason));
  EXPECT_NE(reason.find("already registers a fallback"), std::string::npos) << reason;

  const auto message = sac_test::error_of(
      [] { sac::dispatch::set_mechanism(sac::dispatch::Mechanism::FallbackKey); });
  EXPECT_NE(message.find("already registers a fallback"), std::string::npos) << message;
  EXPECT_NE(message.find("SAC_DISPATCH=per_op"), std::string::npos) << message;

  sac::dispatch::set_mechanism(std::nullopt);  // auto
  EXPECT_EQ(sac::dispatch::mechanism(), sac::dispatch::Mechanism::PerOpKernels);

  // And selective checkpointing works through per-op kernels.
  torch::manual_seed(0);
  auto w = torch::randn({8, 8}, torch::requires_grad());
  auto x = torch::randn({2, 8});
  auto f = [&](const at::Tensor& in) { return torch::tanh(in.mm(w)).mm(w); };
  const auto expected = torch::autograd::grad({f(x).sum()}, {w})[0];
  auto modes = sac::create_selective_checkpoint_contexts(sac::Policy::save_ops({"aten::mm"}));
  auto y = sac::checkpoint(
      sac::CheckpointOptions().context_fn([modes] { return sac::RegionContexts(modes); }), f, x);
  EXPECT_EQ(sac::detail::cache_of(modes)->kept_calls(), 2u);
  EXPECT_TRUE(torch::equal(expected, torch::autograd::grad({y.sum()}, {w})[0]));
}

}  // namespace dispatch_fallback_taken_test
