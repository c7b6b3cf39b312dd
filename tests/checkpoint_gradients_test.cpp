// Gradients under checkpointing are bit-identical to the un-checkpointed run
// on CPU: the same ops run in the same order, for every policy.
#include "support.h"

#include <sac/cache/internal/op_cache.h>
#include <sac/cache/internal/selective_modes.h>

namespace checkpoint_gradients_test {

using sac_test::expect_bit_identical;
using sac_test::run_and_grad;

enum class PolicyKind {
  FullRecompute,
  SaveMatmuls,
  SaveMatmulsAndAttention,
  SaveEverything,
  EveryOtherMatmul
};

std::string name_of(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::FullRecompute: return "FullRecompute";
    case PolicyKind::SaveMatmuls: return "SaveMatmuls";
    case PolicyKind::SaveMatmulsAndAttention: return "SaveMatmulsAndAttention";
    case PolicyKind::SaveEverything: return "SaveEverything";
    case PolicyKind::EveryOtherMatmul: return "EveryOtherMatmul";
  }
  return "?";
}

// Options for `kind`; `saved` (if given) receives the cache of the
// selective modes so tests can see that the policy saved something.
sac::CheckpointOptions options_for(PolicyKind kind,
                                   std::shared_ptr<sac::detail::OpCache>* saved = nullptr) {
  std::optional<sac::Policy> policy;
  switch (kind) {
    case PolicyKind::FullRecompute: return {};
    case PolicyKind::SaveMatmuls:
      policy = sac::Policy::save_ops({"aten::mm", "aten::addmm"});
      break;
    case PolicyKind::SaveMatmulsAndAttention:
      policy = sac::Policy::save_ops(
          {"aten::mm", "aten::addmm", "aten::_scaled_dot_product_flash_attention_for_cpu"});
      break;
    case PolicyKind::SaveEverything:
      policy = sac::Policy::from_fn(
          [](const sac::SelectiveCheckpointContext&, const c10::OperatorHandle&,
             c10::ArrayRef<c10::IValue>) { return sac::CheckpointPolicy::MustSave; });
      break;
    case PolicyKind::EveryOtherMatmul: {
      // Stateful: the count is shared by forward and recomputation, which
      // would corrupt gradients if recomputation asked the policy again.
      auto count = std::make_shared<int>(0);
      policy =
          sac::Policy::from_fn([count](const sac::SelectiveCheckpointContext&,
                                       const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue>) {
            const auto& name = op.operator_name().name;
            return (name == "aten::mm" || name == "aten::addmm") && (*count)++ % 2 == 0;
          });
      break;
    }
  }
  auto modes = sac::create_selective_checkpoint_contexts(*policy);
  if (saved != nullptr) {
    *saved = sac::detail::cache_of(modes);
  }
  return sac::CheckpointOptions().context_fn([modes] { return sac::RegionContexts(modes); });
}

class Gradients : public ::testing::TestWithParam<PolicyKind> {
 protected:
  void SetUp() override { sac_test::expect_configured_mechanism(); }
};

TEST_P(Gradients, MlpBitIdentical) {
  torch::manual_seed(0);
  sac_test::Mlp mlp(32, 64, 16, 4);
  auto x = torch::randn({8, 32}, torch::requires_grad());
  const auto params = mlp->parameters();
  const auto expected = run_and_grad([&] { return mlp->forward(x); }, {x}, params);
  std::shared_ptr<sac::detail::OpCache> cache;
  const auto options = options_for(GetParam(), &cache);
  const auto actual = run_and_grad(
      [&] {
        auto y = sac::checkpoint(
            options, [&](const at::Tensor& in) { return mlp->forward(in); }, x);
        if (cache) {
          EXPECT_GT(cache->kept_calls(), 0u) << "the policy saved nothing";
        }
        return y;
      },
      {x}, params);
  expect_bit_identical(expected, actual);
}

TEST_P(Gradients, GptBlockBitIdentical) {
  torch::manual_seed(0);
  sac_test::GptBlock block(32, 4, /*dropout=*/0.1);
  auto x = torch::randn({2, 16, 32}, torch::requires_grad());
  const auto params = block->parameters();
  const auto expected = run_and_grad([&] { return block->forward(x); }, {x}, params);
  std::shared_ptr<sac::detail::OpCache> cache;
  const auto options = options_for(GetParam(), &cache);
  const auto actual = run_and_grad(
      [&] {
        auto y = sac::checkpoint(
            options, [&](const at::Tensor& in) { return block->forward(in); }, x);
        if (cache) {
          EXPECT_GT(cache->kept_calls(), 0u) << "the policy saved nothing";
        }
        return y;
      },
      {x}, params);
  expect_bit_identical(expected, actual);
}

// Two blocks, each checkpointed: the second's recomputation and the first's
// run in the same backward.
TEST_P(Gradients, StackedGptBlocksBitIdentical) {
  torch::manual_seed(0);
  sac_test::GptBlock a(32, 4, 0.1), b(32, 4, 0.1);
  auto x = torch::randn({2, 8, 32}, torch::requires_grad());
  auto params = a->parameters();
  for (const auto& p : b->parameters()) params.push_back(p);
  const auto expected = run_and_grad([&] { return b->forward(a->forward(x)); }, {x}, params);
  const auto actual = run_and_grad(
      [&] {
        auto h = sac::checkpoint(
            options_for(GetParam()), [&](const at::Tensor& in) { return a->forward(in); }, x);
        return sac::checkpoint(
            options_for(GetParam()), [&](const at::Tensor& in) { return b->forward(in); }, h);
      },
      {x}, params);
  expect_bit_identical(expected, actual);
}

INSTANTIATE_TEST_SUITE_P(AllPolicies, Gradients,
                         ::testing::Values(PolicyKind::FullRecompute, PolicyKind::SaveMatmuls,
                                           PolicyKind::SaveMatmulsAndAttention,
                                           PolicyKind::SaveEverything,
                                           PolicyKind::EveryOtherMatmul),
                         [](const auto& info) { return name_of(info.param); });

// LibTorch's C++ Linear on 3-D input runs aten::mm and adds the bias in place
// through an aten::_unsafe_view of the mm output (its own version counter).
// A cached mm output is thus modified behind its version counter; PyTorch
// 2.13's SAC serves it anyway and gets wrong gradients. sac notices, demotes
// the call to recomputation, and stays bit-identical.
TEST(HiddenAliases, InPlaceBiasThroughUnsafeViewIsNotServed) {
  sac_test::expect_configured_mechanism();
  torch::manual_seed(0);
  torch::nn::Linear linear(16, 16);
  auto x = torch::randn({2, 4, 16}, torch::requires_grad());
  const auto params = linear->parameters();
  auto f = [&](const at::Tensor& in) { return torch::relu(linear->forward(in)).pow(2); };
  const auto expected = sac_test::run_and_grad([&] { return f(x); }, {x}, params);
  auto modes = sac::create_selective_checkpoint_contexts(sac::Policy::save_ops({"aten::mm"}));
  auto options =
      sac::CheckpointOptions().context_fn([modes] { return sac::RegionContexts(modes); });
  const auto actual = sac_test::run_and_grad(
      [&] {
        auto y = sac::checkpoint(options, f, x);
        EXPECT_EQ(sac::detail::cache_of(modes)->kept_calls(), 0u);
        EXPECT_EQ(sac::detail::cache_of(modes)->demoted_calls(), 1u);
        return y;
      },
      {x}, params);
  sac_test::expect_bit_identical(expected, actual);
}

// The other direction: the cached op is the alias (aten::_unsafe_view) and
// its input is modified in place after the alias was used (by an op that does
// not save it, so autograd itself is fine). Serving the cached alias would
// hand the recomputation the modified values.
TEST(HiddenAliases, InputOfACachedAliasModifiedInPlaceIsNotServed) {
  sac_test::expect_configured_mechanism();
  torch::manual_seed(0);
  auto w = torch::randn({8, 8}, torch::requires_grad());
  auto x = torch::randn({4, 8}, torch::requires_grad());
  auto f = [&](const at::Tensor& in) {
    auto h = in.mm(w);
    auto v = at::_unsafe_view(h, {2, 16});
    auto a = (v + 1).sin();  // v + 1 is computed from v as it is now
    h.mul_(2);               // changes v's storage behind v's version counter
    return a.sum() + h.sum();
  };
  const auto expected = sac_test::run_and_grad([&] { return f(x); }, {x}, {w});
  auto modes =
      sac::create_selective_checkpoint_contexts(sac::Policy::save_ops({"aten::_unsafe_view"}));
  auto options =
      sac::CheckpointOptions().context_fn([modes] { return sac::RegionContexts(modes); });
  const auto actual = sac_test::run_and_grad(
      [&] {
        auto y = sac::checkpoint(options, f, x);
        EXPECT_EQ(sac::detail::cache_of(modes)->demoted_calls(), 1u);
        return y;
      },
      {x}, {w});
  sac_test::expect_bit_identical(expected, actual);
}

// The demotion's warning says what happened: whose output, changed by which
// op (named under the fallback key, which sees every op).
TEST(HiddenAliases, DemotionWarningNamesBothOps) {
  sac_test::expect_configured_mechanism();
  struct Warnings : c10::WarningHandler {
    void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
    std::vector<std::string> messages;
  } warnings;
  c10::WarningUtils::WarningHandlerGuard guard(&warnings);
  auto x = torch::randn({4, 4}, torch::requires_grad());
  auto f = [](const at::Tensor& in) {
    auto h = in.cosh();
    h.clamp_(-2, 2);  // the kept cosh output, modified in place
    return h.sin();
  };
  auto modes = sac::create_selective_checkpoint_contexts(sac::Policy::save_ops({"aten::cosh"}));
  auto options =
      sac::CheckpointOptions().context_fn([modes] { return sac::RegionContexts(modes); });
  const auto expected = sac_test::run_and_grad([&] { return f(x); }, {x}, {});
  const auto actual = sac_test::run_and_grad(
      [&] {
        auto y = sac::checkpoint(options, f, x);
        EXPECT_EQ(sac::detail::cache_of(modes)->demoted_calls(), 1u);
        return y;
      },
      {x}, {});
  sac_test::expect_bit_identical(expected, actual);
  // Released after its backward, the cache is as new: no demotion left over.
  EXPECT_TRUE(sac::detail::cache_of(modes)->empty());
  EXPECT_EQ(sac::detail::cache_of(modes)->demoted_calls(), 0u);
  const std::string writer = sac::dispatch::mechanism() == sac::dispatch::Mechanism::FallbackKey
                                 ? "modified in place by aten::clamp_"
                                 : "SAC_DISPATCH=fallback names it";
  size_t found = 0;
  for (const auto& message : warnings.messages) {
    found += message.find("kept the output of aten::cosh (call 0") != std::string::npos &&
             message.find(writer) != std::string::npos;
  }
  EXPECT_EQ(found, 1u) << "warnings: " << c10::Join(" | ", warnings.messages);
}

}  // namespace checkpoint_gradients_test
