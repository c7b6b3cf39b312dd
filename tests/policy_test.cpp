// The policy floor (op names, Policy) and the decisions of the selective
// modes: the policy asked once after each call with its outputs, replay of
// the forward's decisions, the cache served to a recomputation, in-place
// changes to cached values, and random ops.
#include "support.h"

#include <sac/cache/internal/op_cache.h>
#include <sac/policy/internal/op_names.h>
#include <sac/policy/internal/op_traits.h>
#include <sac/policy/internal/answers.h>
#include <sac/dispatch/internal/factory_ops.h>
#include <sac/cache/internal/selective_modes.h>

#include <torch/library.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

// A custom op, to check that names in other namespaces resolve too.
TORCH_LIBRARY(sac_test_ns, m) { m.def("twice(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(sac_test_ns, CompositeExplicitAutograd, m) {
  m.impl("twice", [](const at::Tensor& x) { return x * 2; });
}

namespace policy_test {

using sac_test::error_of;
using sac_test::expect_bit_identical;
using sac_test::run_and_grad;

c10::OperatorHandle op_of(const char* name, const char* overload = "") {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

bool has_op(const std::vector<c10::OperatorHandle>& ops, const c10::OperatorHandle& op) {
  return std::find(ops.begin(), ops.end(), op) != ops.end();
}

class PolicyTest : public ::testing::Test {
 protected:
  void SetUp() override { sac_test::expect_configured_mechanism(); }
};

// ---- Name resolution ---------------------------------------------------------

TEST_F(PolicyTest, NameWithoutOverloadIsTheDefaultOverload) {
  const auto plain = sac::detail::resolve_op_name("aten::mm");
  const auto with_default = sac::detail::resolve_op_name("aten::mm.default");
  ASSERT_EQ(plain.size(), 1u);
  ASSERT_EQ(with_default.size(), 1u);
  EXPECT_EQ(plain[0], op_of("aten::mm"));
  EXPECT_EQ(with_default[0], plain[0]);
}

TEST_F(PolicyTest, NamedOverloadResolvesToThatOverloadOnly) {
  const auto ops = sac::detail::resolve_op_name("aten::add.Tensor");
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0], op_of("aten::add", "Tensor"));
}

TEST_F(PolicyTest, StarResolvesToEveryOverload) {
  const auto ops = sac::detail::resolve_op_name("aten::add.*");
  EXPECT_GT(ops.size(), 1u);
  EXPECT_TRUE(has_op(ops, op_of("aten::add", "Tensor")));
  EXPECT_TRUE(has_op(ops, op_of("aten::add", "Scalar")));
  EXPECT_TRUE(has_op(ops, op_of("aten::add", "out")));
  for (const auto& op : ops) {
    EXPECT_EQ(op.operator_name().name, "aten::add") << c10::toString(op.operator_name());
  }
}

TEST_F(PolicyTest, AmbiguousNameListsOverloadsAndSuggestsStar) {
  const auto msg = error_of([] { sac::detail::resolve_op_name("aten::add"); });
  EXPECT_TRUE(contains(msg, "several overloads")) << msg;
  EXPECT_TRUE(contains(msg, "aten::add.Tensor")) << msg;
  EXPECT_TRUE(contains(msg, "aten::add.Scalar")) << msg;
  EXPECT_TRUE(contains(msg, "\"aten::add.*\"")) << msg;
}

TEST_F(PolicyTest, UnknownNameSuggestsClosestNames) {
  const auto msg = error_of([] { sac::detail::resolve_op_name("aten::mmm"); });
  EXPECT_TRUE(contains(msg, "no operator named 'aten::mmm'")) << msg;
  EXPECT_TRUE(contains(msg, "Closest registered names")) << msg;
  EXPECT_TRUE(contains(msg, "aten::mm")) << msg;
  // aten::mm and aten::bmm are both one edit away.
  const auto closest = sac::detail::closest_op_names("aten::mmm", 2);
  ASSERT_EQ(closest.size(), 2u);
  EXPECT_NE(std::find(closest.begin(), closest.end(), "aten::mm"), closest.end());
}

TEST_F(PolicyTest, UnknownOverloadIsAnError) {
  const auto msg = error_of([] { sac::detail::resolve_op_name("aten::mm.Tensor"); });
  EXPECT_TRUE(contains(msg, "no operator named 'aten::mm.Tensor'")) << msg;
}

TEST_F(PolicyTest, NameWithoutNamespaceSaysHowToWriteOne) {
  const auto msg = error_of([] { sac::detail::resolve_op_name("mm"); });
  EXPECT_TRUE(contains(msg, "'mm' is not an op name")) << msg;
  EXPECT_TRUE(contains(msg, "namespace::name")) << msg;
  EXPECT_TRUE(contains(msg, "\"aten::mm\"")) << msg;
}

TEST_F(PolicyTest, CustomNamespaceOpResolves) {
  const auto ops = sac::detail::resolve_op_name("sac_test_ns::twice");
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0], op_of("sac_test_ns::twice"));
  const auto with_default = sac::detail::resolve_op_name("sac_test_ns::twice.default");
  ASSERT_EQ(with_default.size(), 1u);
  EXPECT_EQ(with_default[0], ops[0]);
  // It is an ordinary functional op: save_ops accepts it.
  const auto policy = sac::Policy::save_ops({"sac_test_ns::twice"});
  ASSERT_EQ(policy.domain().ops.size(), 1u);
  EXPECT_EQ(policy.domain().ops[0], ops[0]);
}

// ---- save_ops validation -------------------------------------------------------

void expect_rejected(const std::string& name, const std::string& reason) {
  SCOPED_TRACE(name);
  const auto msg = error_of([&] { sac::Policy::save_ops({"aten::mm", name}); });
  EXPECT_TRUE(contains(msg, "cannot save '" + name + "'")) << msg;
  EXPECT_TRUE(contains(msg, reason)) << msg;
  EXPECT_TRUE(contains(msg, "Remove it from the list")) << msg;
}

TEST_F(PolicyTest, SaveOpsRejectsViews) {
  expect_rejected("aten::t", "it is a view");
  expect_rejected("aten::view", "it is a view");
}

TEST_F(PolicyTest, SaveOpsRejectsInPlaceOps) {
  expect_rejected("aten::add_.Tensor", "it mutates an input");
}

TEST_F(PolicyTest, SaveOpsRejectsOutVariants) {
  expect_rejected("aten::mm.out", "it mutates an input");
}

TEST_F(PolicyTest, SaveOpsRejectsCompositeImplicitOps) {
  expect_rejected("aten::dropout", "decomposes into other ops above autograd");
  const auto msg = error_of([] { sac::Policy::save_ops({"aten::dropout"}); });
  EXPECT_TRUE(contains(msg, "Name the ops it decomposes into instead")) << msg;
}

// aten::linear and aten::matmul are CompositeImplicitAutograd on dense
// tensors but also have an Autograd kernel (for nested tensors); on CPU they
// still decompose above autograd and never reach sac.
TEST_F(PolicyTest, SaveOpsRejectsCompositeImplicitOpsWithNestedTensorKernels) {
  expect_rejected("aten::linear", "decomposes into other ops above autograd");
  const auto msg = error_of([] { sac::Policy::save_ops({"aten::linear"}); });
  EXPECT_TRUE(contains(msg, "aten::addmm")) << msg;  // what to name instead
  expect_rejected("aten::matmul", "decomposes into other ops above autograd");
}

TEST_F(PolicyTest, SaveOpsRejectsIgnoredOps) { expect_rejected("aten::detach", "ignores it"); }

TEST_F(PolicyTest, SaveOpsRejectsEmptyList) {
  const auto msg = error_of([] { sac::Policy::save_ops({}); });
  EXPECT_TRUE(contains(msg, "empty op list")) << msg;
  EXPECT_TRUE(contains(msg, "without a policy")) << msg;
}

TEST_F(PolicyTest, SaveOpsPropagatesNameErrors) {
  const auto msg = error_of([] { sac::Policy::save_ops({"aten::mm", "aten::add"}); });
  EXPECT_TRUE(contains(msg, "aten::add.Tensor")) << msg;
  EXPECT_TRUE(contains(msg, "aten::add.*")) << msg;
}

TEST_F(PolicyTest, SaveOpsStarKeepsOnlyCacheableOverloads) {
  const auto policy = sac::Policy::save_ops({"aten::add.*"});
  const auto& ops = policy.domain().ops;
  EXPECT_TRUE(has_op(ops, op_of("aten::add", "Tensor")));
  EXPECT_TRUE(has_op(ops, op_of("aten::add", "Scalar")));
  EXPECT_FALSE(has_op(ops, op_of("aten::add", "out")));
  for (const auto& op : ops) {
    EXPECT_TRUE(sac::detail::is_cacheable(op)) << c10::toString(op.operator_name());
  }
}

TEST_F(PolicyTest, SaveOpsStarWithNothingCacheableIsRejected) {
  const auto msg = error_of([] { sac::Policy::save_ops({"aten::t.*"}); });
  EXPECT_TRUE(contains(msg, "no overload of 'aten::t.*' can be cached")) << msg;
  EXPECT_TRUE(contains(msg, "Remove it from the list")) << msg;
}

TEST_F(PolicyTest, SaveOpsDeduplicatesAndDescribesItself) {
  const auto policy = sac::Policy::save_ops({"aten::mm", "aten::mm.default", "aten::addmm"});
  ASSERT_EQ(policy.domain().ops.size(), 2u);
  EXPECT_EQ(policy.domain().ops[0], op_of("aten::mm"));
  EXPECT_EQ(policy.domain().ops[1], op_of("aten::addmm"));
  EXPECT_EQ(policy.describe(), "save_ops(aten::mm, aten::mm.default, aten::addmm)");
}

TEST_F(PolicyTest, SaveOpsDecidesSaveForListedOpsOnly) {
  const auto policy = sac::Policy::save_ops({"aten::mm"});
  EXPECT_EQ(policy.decide({}, op_of("aten::mm"), {}), sac::CheckpointPolicy::MustSave);
  EXPECT_EQ(policy.decide({}, op_of("aten::addmm"), {}), sac::CheckpointPolicy::PreferRecompute);
}

// ---- Callback policies -------------------------------------------------------

TEST_F(PolicyTest, FromFnRejectsEmptyFunction) {
  const auto msg = error_of([] { sac::Policy::from_fn(sac::Policy::Fn()); });
  EXPECT_TRUE(contains(msg, "empty std::function")) << msg;
  EXPECT_TRUE(contains(msg, "pass a callable")) << msg;
  const auto bool_msg = error_of([] { sac::Policy::from_fn(sac::Policy::BoolFn()); });
  EXPECT_TRUE(contains(bool_msg, "empty std::function")) << bool_msg;
}

TEST_F(PolicyTest, BoolCallbackMapsTrueToMustSaveAndFalseToPreferRecompute) {
  bool answer = true;
  const auto policy = sac::Policy::from_fn(
      [&answer](const sac::SelectiveCheckpointContext&, const c10::OperatorHandle&,
                c10::ArrayRef<c10::IValue>) { return answer; });
  const auto mm = op_of("aten::mm");
  EXPECT_EQ(policy.decide({}, mm, {}), sac::CheckpointPolicy::MustSave);
  answer = false;
  EXPECT_EQ(policy.decide({}, mm, {}), sac::CheckpointPolicy::PreferRecompute);
  EXPECT_EQ(policy.describe(), "callback");
  EXPECT_TRUE(policy.domain().every_cacheable_op);
}

TEST_F(PolicyTest, CallbackSeesContextOpAndArgs) {
  sac::SelectiveCheckpointContext seen_ctx;
  std::string seen_op;
  size_t seen_args = 0;
  const auto policy =
      sac::Policy::from_fn([&](const sac::SelectiveCheckpointContext& ctx,
                               const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
        seen_ctx = ctx;
        seen_op = c10::toString(op.operator_name());
        seen_args = args.size();
        return sac::CheckpointPolicy::PreferSave;
      });
  const std::vector<c10::IValue> args{at::ones({2, 2}), at::ones({2, 2})};
  const std::vector<c10::IValue> outputs{at::ones({2, 2})};
  EXPECT_EQ(policy.decide({false, outputs, 3}, op_of("aten::mm"), args),
            sac::CheckpointPolicy::PreferSave);
  EXPECT_FALSE(seen_ctx.is_recompute);
  EXPECT_EQ(seen_ctx.call, 3u);
  EXPECT_EQ(seen_ctx.op_output.size(), 1u);
  EXPECT_EQ(seen_op, "aten::mm");
  EXPECT_EQ(seen_args, 2u);
}

// ---- Decisions through sac::checkpoint ----------------------------------------

// n matmuls with tanh between them.
at::Tensor mm_chain(const at::Tensor& x, const at::Tensor& w, int n) {
  at::Tensor h = x;
  for (int i = 0; i < n; ++i) {
    h = h.mm(w);
    if (i + 1 < n) {
      h = h.tanh();
    }
  }
  return h;
}

// What a counting policy has been asked.
struct Asked {
  int calls = 0;     // all calls
  int mm_calls = 0;  // calls about aten::mm
};

// Saves every other aten::mm call; its count is shared by all passes.
sac::Policy every_other_mm(const std::shared_ptr<Asked>& asked) {
  return sac::Policy::from_fn([asked](const sac::SelectiveCheckpointContext&,
                                      const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue>) {
    ++asked->calls;
    if (op.operator_name().name != "aten::mm") {
      return false;
    }
    return asked->mm_calls++ % 2 == 0;
  });
}

struct ChainInputs {
  at::Tensor x, w;
};

ChainInputs chain_inputs() {
  torch::manual_seed(0);
  return {torch::randn({6, 8}, torch::requires_grad()),
          (torch::randn({8, 8}) * 0.5).requires_grad_()};
}

TEST_F(PolicyTest, StatefulPolicyIsAskedOnlyInForwardAndGradientsMatch) {
  constexpr int kMatmuls = 4;
  const auto in = chain_inputs();
  const auto expected =
      run_and_grad([&] { return mm_chain(in.x, in.w, kMatmuls); }, {in.x}, {in.w});

  auto asked = std::make_shared<Asked>();
  const auto options = sac::CheckpointOptions().policy(every_other_mm(asked));
  Asked after_forward;
  const auto actual = run_and_grad(
      [&] {
        auto y = sac::checkpoint(
            options, [&](const at::Tensor& x) { return mm_chain(x, in.w, kMatmuls); }, in.x);
        after_forward = *asked;
        return y;
      },
      {in.x}, {in.w});
  expect_bit_identical(expected, actual);

  EXPECT_EQ(after_forward.mm_calls, kMatmuls);
  EXPECT_GT(after_forward.calls, kMatmuls);  // the tanh calls are asked about too
  // The recomputation replays the forward's decisions without asking.
  EXPECT_EQ(asked->mm_calls, kMatmuls);
  EXPECT_EQ(asked->calls, after_forward.calls);
}

// PyTorch 2.13 asks after the op ran, with ctx.op_output: each callback call
// sees the very tensors the op returned, and the call's index.
TEST_F(PolicyTest, CallbackSeesTheOpOutputAndCallIndexOnceInForward) {
  constexpr int kMatmuls = 3;
  const auto in = chain_inputs();
  struct Seen {
    std::vector<at::Tensor> outputs;  // of each aten::mm call
    std::vector<size_t> calls;        // their indices
  };
  auto seen = std::make_shared<Seen>();
  const auto policy =
      sac::Policy::from_fn([seen](const sac::SelectiveCheckpointContext& ctx,
                                  const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
        if (op.operator_name().name != "aten::mm") {
          return sac::CheckpointPolicy::PreferRecompute;
        }
        EXPECT_EQ(args.size(), 2u);
        EXPECT_EQ(ctx.op_output.size(), 1u);
        seen->outputs.push_back(ctx.op_output[0].toTensor());
        seen->calls.push_back(ctx.call);
        return sac::CheckpointPolicy::MustSave;
      });
  std::vector<at::Tensor> returned;  // what each mm returned to the caller
  auto y = sac::checkpoint(
      sac::CheckpointOptions().policy(policy),
      [&](const at::Tensor& x) {
        at::Tensor h = x;
        for (int i = 0; i < kMatmuls; ++i) {
          h = h.mm(in.w);
          returned.push_back(h);
          h = h.tanh();
        }
        return h;
      },
      in.x);
  ASSERT_EQ(seen->outputs.size(), static_cast<size_t>(kMatmuls));
  for (int i = 0; i < kMatmuls; ++i) {
    EXPECT_EQ(seen->calls[i], static_cast<size_t>(i));
    // Same memory and the same values: the op's own output (below autograd).
    EXPECT_TRUE(seen->outputs[i].is_alias_of(returned[i]));
    EXPECT_TRUE(torch::equal(seen->outputs[i], returned[i]));
  }
  const size_t returned_in_forward = returned.size();
  torch::autograd::grad({y.sum()}, {in.x, in.w});
  // Not asked during the recomputation, which ran the function again.
  EXPECT_EQ(seen->outputs.size(), static_cast<size_t>(kMatmuls));
  EXPECT_GT(returned.size(), returned_in_forward);
}

// ---- The modes on their own ----------------------------------------------------

struct MatmulOperands {
  at::Tensor a, b;
};

MatmulOperands operands() {
  torch::manual_seed(0);
  return {torch::randn({4, 5}), torch::randn({5, 3})};
}

TEST_F(PolicyTest, CachedModeServesForwardOutputWithoutRecomputing) {
  const auto ab = operands();
  const at::Tensor& a = ab.a;
  const at::Tensor& b = ab.b;
  auto modes = sac::create_selective_checkpoint_contexts(sac::Policy::save_ops({"aten::mm"}));
  at::Tensor y;
  {
    sac::RegionContext::Scope scope(modes.caching.get());
    y = a.mm(b);
  }
  EXPECT_EQ(sac::detail::cache_of(modes)->kept_calls(), 1u);
  EXPECT_EQ(sac::detail::cache_of(modes)->bytes(), static_cast<size_t>(y.numel()) * sizeof(float));
  EXPECT_EQ(sac::detail::cache_of(modes)->demoted_calls(), 0u);

  at::Tensor y2;
  {
    sac::RegionContext::Scope scope(modes.cached.get());
    y2 = a.mm(b);
  }
  EXPECT_TRUE(torch::equal(y2, y));
  EXPECT_EQ(y2.data_ptr(), y.data_ptr()) << "recomputed instead of served from the cache";
  EXPECT_EQ(sac::detail::cache_of(modes)->kept_calls(), 0u);
  EXPECT_EQ(sac::detail::cache_of(modes)->bytes(), 0u);
}

TEST_F(PolicyTest, CachedModeRecomputesCallsThePolicyDidNotSave) {
  const auto ab = operands();
  const at::Tensor& a = ab.a;
  const at::Tensor& b = ab.b;
  auto modes = sac::create_selective_checkpoint_contexts(sac::Policy::save_ops({"aten::addmm"}));
  const auto bias = at::ones({3});
  at::Tensor y, z;
  {
    sac::RegionContext::Scope scope(modes.caching.get());
    y = a.mm(b);
    z = at::addmm(bias, a, b);
  }
  EXPECT_EQ(sac::detail::cache_of(modes)->kept_calls(), 1u);
  at::Tensor y2, z2;
  {
    sac::RegionContext::Scope scope(modes.cached.get());
    y2 = a.mm(b);
    z2 = at::addmm(bias, a, b);
  }
  EXPECT_TRUE(torch::equal(y2, y));
  EXPECT_NE(y2.data_ptr(), y.data_ptr());  // mm was recomputed
  EXPECT_EQ(z2.data_ptr(), z.data_ptr());  // addmm was served
}

TEST_F(PolicyTest, CachedModeRefusesASecondBackward) {
  const auto ab = operands();
  const at::Tensor& a = ab.a;
  const at::Tensor& b = ab.b;
  auto modes = sac::create_selective_checkpoint_contexts(sac::Policy::save_ops({"aten::mm"}));
  {
    sac::RegionContext::Scope scope(modes.caching.get());
    a.mm(b);
  }
  {
    sac::RegionContext::Scope scope(modes.cached.get());
    a.mm(b);
  }
  sac::RegionContext::Scope scope(modes.cached.get());
  const auto msg = error_of([&] { a.mm(b); });
  EXPECT_TRUE(contains(msg, "extra time")) << msg;
  EXPECT_TRUE(contains(msg, "aten::mm")) << msg;
  EXPECT_TRUE(contains(msg, "run its forward again")) << msg;
}

TEST_F(PolicyTest, CachedModeRejectsOpNeverRunInForward) {
  const auto ab = operands();
  const at::Tensor& a = ab.a;
  const at::Tensor& b = ab.b;
  auto modes =
      sac::create_selective_checkpoint_contexts(sac::Policy::save_ops({"aten::mm", "aten::addmm"}));
  {
    sac::RegionContext::Scope scope(modes.caching.get());
    a.mm(b);
  }
  const auto bias = at::ones({3});  // outside the mode: it is an op too
  sac::RegionContext::Scope scope(modes.cached.get());
  const auto msg = error_of([&] { at::addmm(bias, a, b); });
  EXPECT_TRUE(contains(msg, "aten::addmm")) << msg;
  EXPECT_TRUE(contains(msg, "never in the checkpointed forward")) << msg;
  EXPECT_TRUE(contains(msg, "must run the same ops")) << msg;
}

TEST_F(PolicyTest, CachedModeRejectsMoreCallsThanForward) {
  const auto ab = operands();
  const at::Tensor& a = ab.a;
  const at::Tensor& b = ab.b;
  auto modes = sac::create_selective_checkpoint_contexts(sac::Policy::save_ops({"aten::mm"}));
  {
    sac::RegionContext::Scope scope(modes.caching.get());
    a.mm(b);
  }
  sac::RegionContext::Scope scope(modes.cached.get());
  a.mm(b);
  const auto msg = error_of([&] { a.mm(b); });
  EXPECT_TRUE(contains(msg, "aten::mm")) << msg;
  EXPECT_TRUE(contains(msg, "times in the checkpointed forward")) << msg;
}

TEST_F(PolicyTest, CachedValueModifiedAfterForwardIsAnError) {
  const auto ab = operands();
  const at::Tensor& a = ab.a;
  const at::Tensor& b = ab.b;
  auto modes = sac::create_selective_checkpoint_contexts(sac::Policy::save_ops({"aten::mm"}));
  at::Tensor y;
  {
    sac::RegionContext::Scope scope(modes.caching.get());
    y = a.mm(b);
  }
  EXPECT_EQ(sac::detail::cache_of(modes)->kept_calls(), 1u);
  y.add_(1);
  sac::RegionContext::Scope scope(modes.cached.get());
  const auto msg = error_of([&] { a.mm(b); });
  EXPECT_TRUE(contains(msg, "modified in place")) << msg;
  EXPECT_TRUE(contains(msg, "allow_cache_entry_mutation")) << msg;
}

TEST_F(PolicyTest, CachedValueModifiedAfterForwardIsServedWhenAllowed) {
  const auto ab = operands();
  const at::Tensor& a = ab.a;
  const at::Tensor& b = ab.b;
  auto modes = sac::create_selective_checkpoint_contexts(sac::Policy::save_ops({"aten::mm"}),
                                                         /*allow_cache_entry_mutation=*/true);
  at::Tensor y;
  {
    sac::RegionContext::Scope scope(modes.caching.get());
    y = a.mm(b);
  }
  y.add_(1);
  at::Tensor y2;
  {
    sac::RegionContext::Scope scope(modes.cached.get());
    ASSERT_NO_THROW(y2 = a.mm(b));
  }
  EXPECT_TRUE(torch::equal(y2, a.mm(b) + 1));
  EXPECT_EQ(y2.data_ptr(), y.data_ptr());
}

TEST_F(PolicyTest, CachedValueModifiedDuringForwardIsDemoted) {
  const auto ab = operands();
  const at::Tensor& a = ab.a;
  const at::Tensor& b = ab.b;
  auto modes = sac::create_selective_checkpoint_contexts(sac::Policy::save_ops({"aten::mm"}));
  {
    sac::RegionContext::Scope scope(modes.caching.get());
    auto y = a.mm(b);
    y.mul_(2);
    EXPECT_EQ(sac::detail::cache_of(modes)->kept_calls(), 1u);  // demoted only on exit
  }
  EXPECT_EQ(sac::detail::cache_of(modes)->kept_calls(), 0u);
  EXPECT_EQ(sac::detail::cache_of(modes)->demoted_calls(), 1u);
  EXPECT_EQ(sac::detail::cache_of(modes)->bytes(), 0u);
  // The demoted call is recomputed.
  at::Tensor y2;
  {
    sac::RegionContext::Scope scope(modes.cached.get());
    ASSERT_NO_THROW(y2 = a.mm(b));
  }
  EXPECT_TRUE(torch::equal(y2, a.mm(b)));
}

// ---- Random ops ----------------------------------------------------------------

// The policy saves the first of two random draws. Serving it must leave the
// generator where the forward left it, so that the recomputed second draw gets
// the forward's numbers. Both draws are saved by autograd (each is a factor of
// a product), so a wrong second draw shows in the gradient.
TEST_F(PolicyTest, ServedRandomOpRestoresGeneratorForLaterDraws) {
  torch::manual_seed(0);
  auto x = torch::randn({5, 7}, torch::requires_grad());
  auto f = [](const at::Tensor& in) { return in * at::rand_like(in) * at::rand_like(in); };
  const auto expected = run_and_grad([&] { return f(x); }, {x}, {});

  const auto rand_like = op_of("aten::rand_like");
  ASSERT_TRUE(sac::detail::is_random(rand_like));
  ASSERT_TRUE(sac::detail::is_cacheable(rand_like));
  auto draws = std::make_shared<int>(0);
  const auto policy = sac::Policy::from_fn(
      [draws, rand_like](const sac::SelectiveCheckpointContext&, const c10::OperatorHandle& op,
                         c10::ArrayRef<c10::IValue>) {
        return op == rand_like && (*draws)++ == 0;
      });
  auto modes = sac::create_selective_checkpoint_contexts(policy);
  const auto options = sac::CheckpointOptions().preserve_rng_state(true).context_fn(
      [modes] { return sac::RegionContexts(modes); });
  const auto actual = run_and_grad(
      [&] {
        auto y = sac::checkpoint(options, f, x);
        EXPECT_EQ(*draws, 2);
        EXPECT_EQ(sac::detail::cache_of(modes)->kept_calls(), 1u);
        return y;
      },
      {x}, {});
  expect_bit_identical(expected, actual);
  EXPECT_EQ(sac::detail::cache_of(modes)->kept_calls(), 0u) << "the saved draw was not served";
}

// ---- Ops per-op kernels miss ------------------------------------------------------

// LibTorch's torch:: factory functions dispatch below ADInplaceOrView, where
// per-op kernels sit (sac::detail::per_op_kernels_miss): a list naming
// such an op is refused there at once; the fallback key sees and keeps it.
TEST_F(PolicyTest, SaveOpsNamingAFactoryOpIsRefusedUnderPerOpKernelsOnly) {
  if (sac::dispatch::mechanism() == sac::dispatch::Mechanism::PerOpKernels) {
    for (const char* name : {"aten::arange", "aten::zeros", "aten::randn_like"}) {
      const auto message = error_of([&] { sac::Policy::save_ops({"aten::mm", name}); });
      EXPECT_NE(message.find("per-op kernels never see"), std::string::npos) << message;
      EXPECT_NE(message.find("SAC_DISPATCH=fallback"), std::string::npos) << message;
    }
    // Recomputing them is what happens anyway.
    sac::Policy::answer_ops({"aten::arange"}, sac::CheckpointPolicy::MustRecompute);
    return;
  }
  auto x = torch::randn({4}, torch::requires_grad());
  auto f = [](const at::Tensor& a) { return (a * torch::arange(4)).sin(); };
  auto stats = std::make_shared<sac::RegionStatistics>();
  const auto options = sac::CheckpointOptions()
                           .policy(sac::Policy::save_ops({"aten::arange", "aten::mul.Tensor"}))
                           .statistics(stats);
  const auto expected = sac_test::run_and_grad([&] { return f(x); }, {x}, {});
  const auto actual =
      sac_test::run_and_grad([&] { return sac::checkpoint(options, f, x); }, {x}, {});
  sac_test::expect_bit_identical(expected, actual);
  EXPECT_EQ(stats->read().calls_saved, 2u);  // arange and mul
}

// A callback cannot be refused up front: it is told once per op when it
// keeps a call of one (made through at::, which per-op kernels do see).
TEST_F(PolicyTest, ACallbackKeepingAFactoryOpIsWarnedUnderPerOpKernelsOnly) {
  struct Warnings : c10::WarningHandler {
    void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
    std::vector<std::string> messages;
  } warnings;
  c10::WarningUtils::WarningHandlerGuard guard(&warnings);
  auto x = torch::randn({4}, torch::requires_grad());
  auto f = [](const at::Tensor& a) { return (a * at::zeros({4}).add(1.5)).sin(); };
  const auto options = sac::CheckpointOptions().policy(
      sac::Policy::from_fn([](const sac::SelectiveCheckpointContext&, const c10::OperatorHandle&,
                              c10::ArrayRef<c10::IValue>) { return true; }));
  for (int i = 0; i < 2; ++i) {
    sac_test::run_and_grad([&] { return sac::checkpoint(options, f, x); }, {x}, {});
  }
  size_t warned = 0;
  for (const auto& message : warnings.messages) {
    warned += message.find("per-op kernels never see") != std::string::npos &&
              message.find("aten::zeros") != std::string::npos;
  }
  const bool per_op = sac::dispatch::mechanism() == sac::dispatch::Mechanism::PerOpKernels;
  EXPECT_EQ(warned, per_op ? 1u : 0u);
}

}  // namespace policy_test
