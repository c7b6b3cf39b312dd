// The policy vocabulary: the rule that combines answers, each combinator,
// each preset's answers, and every one of them through sac::checkpoint and a
// CheckpointScope with bit-identical gradients.
#include "support.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace policy_presets_test {

using sac::CheckpointPolicy;
using sac_test::error_of;
using sac_test::expect_bit_identical;
using sac_test::run_and_grad;

c10::OperatorHandle op_of(const char* name, const char* overload = "") {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

// The answer of `policy` for one call of `op` whose output is `output`.
CheckpointPolicy answer(const sac::Policy& policy, const char* op, size_t call = 0,
                        const at::Tensor& output = at::ones({4, 8})) {
  const std::vector<c10::IValue> outputs{output};
  const auto handle = op_of(op);
  EXPECT_TRUE(policy.decides_about(handle)) << policy.describe() << " about " << op;
  return policy.decide({false, outputs, call}, handle, {});
}

sac::Policy mm_gets(CheckpointPolicy a) { return sac::Policy::answer_ops({"aten::mm"}, a); }

class Vocabulary : public ::testing::Test {
 protected:
  void SetUp() override { sac_test::expect_configured_mechanism(); }
};

// ---- The rule --------------------------------------------------------------------

TEST_F(Vocabulary, AnyOfKeepsTheMost) {
  using P = CheckpointPolicy;
  EXPECT_EQ(answer(sac::any_of({mm_gets(P::PreferRecompute), mm_gets(P::PreferCpuOffload),
                                mm_gets(P::PreferSave)}),
                   "aten::mm"),
            P::PreferSave);
  EXPECT_EQ(answer(sac::any_of({mm_gets(P::PreferRecompute), mm_gets(P::PreferCpuOffload)}),
                   "aten::mm"),
            P::PreferCpuOffload);
  EXPECT_EQ(answer(sac::any_of({mm_gets(P::PreferSave), mm_gets(P::MustRecompute)}), "aten::mm"),
            P::PreferSave);
  EXPECT_EQ(answer(sac::any_of({mm_gets(P::MustCpuOffload), mm_gets(P::PreferSave)}), "aten::mm"),
            P::PreferSave);
  // Between answers that keep alike, Must beats Prefer.
  EXPECT_EQ(answer(sac::any_of({mm_gets(P::PreferSave), mm_gets(P::MustSave)}), "aten::mm"),
            P::MustSave);
}

TEST_F(Vocabulary, AllOfKeepsTheLeast) {
  using P = CheckpointPolicy;
  EXPECT_EQ(answer(sac::all_of({mm_gets(P::PreferSave), mm_gets(P::PreferCpuOffload)}), "aten::mm"),
            P::PreferCpuOffload);
  EXPECT_EQ(answer(sac::all_of({mm_gets(P::PreferSave), mm_gets(P::PreferRecompute)}), "aten::mm"),
            P::PreferRecompute);
  EXPECT_EQ(answer(sac::all_of({mm_gets(P::MustSave), mm_gets(P::PreferRecompute)}), "aten::mm"),
            P::PreferRecompute);
  EXPECT_EQ(answer(sac::all_of({mm_gets(P::PreferRecompute), mm_gets(P::MustRecompute)}),
                   "aten::mm"),
            P::MustRecompute);
}

TEST_F(Vocabulary, APolicyOutsideItsDomainAnswersPreferRecompute) {
  // addmm is only in the second policy's domain.
  const auto either =
      sac::any_of({sac::Policy::save_ops({"aten::mm"}), sac::Policy::save_ops({"aten::addmm"})});
  EXPECT_EQ(answer(either, "aten::addmm"), CheckpointPolicy::MustSave);
  EXPECT_FALSE(either.decides_about(op_of("aten::relu")));
  const auto both =
      sac::all_of({sac::Policy::save_ops({"aten::mm"}), sac::Policy::save_ops({"aten::addmm"})});
  EXPECT_EQ(answer(both, "aten::addmm"), CheckpointPolicy::PreferRecompute);
  EXPECT_EQ(either.describe(), "any_of(save_ops(aten::mm), save_ops(aten::addmm))");
}

TEST_F(Vocabulary, CombinatorsRejectEmptyInput) {
  EXPECT_NE(error_of([] { sac::any_of({}); }).find("got no policies"), std::string::npos);
  EXPECT_NE(error_of([] { sac::all_of({}); }).find("got no policies"), std::string::npos);
  EXPECT_NE(error_of([] { sac::every_nth("aten::mm", 0); }).find("at least 1"), std::string::npos);
  EXPECT_NE(error_of([] { sac::every_nth("aten::nope", 2); }).find("aten::nope"),
            std::string::npos);
  EXPECT_NE(error_of([] { sac::for_shapes(sac::everything_saveable(), nullptr); }).find("empty"),
            std::string::npos);
}

TEST_F(Vocabulary, ExceptRecomputesWhereTheExclusionKeeps) {
  using P = CheckpointPolicy;
  EXPECT_EQ(answer(sac::except(mm_gets(P::PreferSave), mm_gets(P::PreferSave)), "aten::mm"),
            P::PreferRecompute);
  EXPECT_EQ(answer(sac::except(mm_gets(P::MustSave), mm_gets(P::PreferCpuOffload)), "aten::mm"),
            P::MustRecompute);
  EXPECT_EQ(answer(sac::except(mm_gets(P::PreferSave), mm_gets(P::MustRecompute)), "aten::mm"),
            P::PreferSave);
  // Its domain is the first policy's: the exclusion cannot add ops.
  const auto p = sac::except(sac::Policy::save_ops({"aten::mm"}), sac::everything_saveable());
  EXPECT_FALSE(p.decides_about(op_of("aten::relu")));
}

TEST_F(Vocabulary, EveryNthKeepsEveryNthCallOfItsOp) {
  const auto p = sac::every_nth("aten::mm", 3);
  for (size_t call = 0; call < 7; ++call) {
    EXPECT_EQ(answer(p, "aten::mm", call),
              call % 3 == 2 ? CheckpointPolicy::MustSave : CheckpointPolicy::PreferRecompute)
        << "call " << call;
  }
  EXPECT_FALSE(p.decides_about(op_of("aten::addmm")));
  EXPECT_EQ(p.describe(), "every_nth(aten::mm, 3)");
}

TEST_F(Vocabulary, ForShapesKeepsOnlyMatchingOutputs) {
  const auto p = sac::for_shapes(sac::Policy::save_ops({"aten::mm"}),
                                 [](c10::IntArrayRef sizes) { return sizes[0] >= 8; });
  EXPECT_EQ(answer(p, "aten::mm", 0, at::ones({8, 2})), CheckpointPolicy::MustSave);
  EXPECT_EQ(answer(p, "aten::mm", 0, at::ones({4, 2})), CheckpointPolicy::PreferRecompute);
}

TEST_F(Vocabulary, OffloadIfTurnsSavesIntoOffloadsOfTheSameStrength) {
  const auto big = [](const at::Tensor& t) { return t.numel() >= 32; };
  const auto p = sac::offload_if(
      sac::any_of({sac::Policy::save_ops({"aten::mm"}),
                   sac::Policy::answer_ops({"aten::addmm"}, CheckpointPolicy::PreferSave)}),
      big);
  EXPECT_EQ(answer(p, "aten::mm", 0, at::ones({4, 8})), CheckpointPolicy::MustCpuOffload);
  EXPECT_EQ(answer(p, "aten::mm", 0, at::ones({2, 8})), CheckpointPolicy::MustSave);
  EXPECT_EQ(answer(p, "aten::addmm", 0, at::ones({4, 8})), CheckpointPolicy::PreferCpuOffload);
  const auto by_bytes = sac::offload_if(sac::Policy::save_ops({"aten::mm"}), int64_t{128});
  EXPECT_EQ(answer(by_bytes, "aten::mm", 0, at::ones({4, 8})), CheckpointPolicy::MustCpuOffload);
  EXPECT_EQ(answer(by_bytes, "aten::mm", 0, at::ones({4, 7})), CheckpointPolicy::MustSave);
  // Recompute answers stay.
  EXPECT_EQ(answer(sac::offload_if(mm_gets(CheckpointPolicy::PreferRecompute), big), "aten::mm"),
            CheckpointPolicy::PreferRecompute);
}

// ---- Presets -------------------------------------------------------------------------

TEST_F(Vocabulary, NothingAndEverythingSaveable) {
  EXPECT_FALSE(sac::nothing_saveable().decides_about(op_of("aten::mm")));
  const auto all = sac::everything_saveable();
  EXPECT_EQ(answer(all, "aten::relu"), CheckpointPolicy::PreferSave);
  EXPECT_FALSE(all.decides_about(op_of("aten::t"))) << "views are never cached";
}

TEST_F(Vocabulary, ComputeIntensiveOps) {
  const auto p = sac::compute_intensive_ops();
  for (const char* op : {"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm",
                         "aten::convolution", "aten::_scaled_dot_product_flash_attention_for_cpu",
                         "aten::_scaled_dot_product_efficient_attention"}) {
    EXPECT_EQ(answer(p, op), CheckpointPolicy::MustSave) << op;
  }
  EXPECT_FALSE(p.decides_about(op_of("aten::relu")));
}

TEST_F(Vocabulary, TorchtitanRecomputesEverySecondMatmul) {
  const auto p = sac::torchtitan_default();
  EXPECT_EQ(answer(p, "aten::mm", 0), CheckpointPolicy::MustSave);
  EXPECT_EQ(answer(p, "aten::mm", 1), CheckpointPolicy::MustRecompute);
  EXPECT_EQ(answer(p, "aten::mm", 2), CheckpointPolicy::MustSave);
  EXPECT_EQ(answer(p, "aten::addmm", 1), CheckpointPolicy::MustSave) << "only mm is counted";
  EXPECT_EQ(answer(p, "aten::max"), CheckpointPolicy::MustSave);
  EXPECT_EQ(answer(p, "aten::topk"), CheckpointPolicy::MustSave);
}

TEST_F(Vocabulary, JaxDots) {
  const auto dots = sac::dots_saveable();
  for (const char* op : {"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::mv"}) {
    EXPECT_EQ(answer(dots, op), CheckpointPolicy::PreferSave) << op;
  }
  const auto flat = sac::dots_with_no_batch_dims_saveable();
  EXPECT_EQ(answer(flat, "aten::mm"), CheckpointPolicy::PreferSave);
  EXPECT_FALSE(flat.decides_about(op_of("aten::bmm")));
  EXPECT_EQ(answer(sac::offload_dot_with_no_batch_dims(), "aten::addmm"),
            CheckpointPolicy::PreferCpuOffload);
}

TEST_F(Vocabulary, OutputsLargerThan) {
  const auto p = sac::outputs_larger_than(127);
  EXPECT_EQ(answer(p, "aten::relu", 0, at::ones({4, 8})),
            CheckpointPolicy::PreferSave);  // 128 bytes
  EXPECT_EQ(answer(p, "aten::relu", 0, at::ones({4, 7})), CheckpointPolicy::PreferRecompute);
}

TEST_F(Vocabulary, NeverRecomputeCollectives) {
  const auto p = sac::never_recompute_collectives();
  const auto all_reduce = c10::Dispatcher::singleton().findOp({"_c10d_functional::all_reduce", ""});
  if (!all_reduce.has_value()) {
    GTEST_SKIP() << "this LibTorch registers no functional collectives";
  }
  EXPECT_EQ(answer(p, "_c10d_functional::all_reduce"), CheckpointPolicy::MustSave);
  EXPECT_EQ(answer(p, "_c10d_functional::reduce_scatter_tensor"), CheckpointPolicy::MustSave);
  EXPECT_FALSE(p.decides_about(op_of("aten::mm")));
}

// ---- Every policy through a checkpoint -----------------------------------------------

// Convolution, addmm, two matmuls, attention, bmm, max and topk.
struct Model {
  Model() {
    torch::manual_seed(0);
    x = torch::randn({2, 3, 6, 6}, torch::requires_grad());
    conv = (torch::randn({4, 3, 3, 3}) * 0.3).requires_grad_();
    w1 = (torch::randn({144, 32}) * 0.1).requires_grad_();
    b1 = torch::randn({32}, torch::requires_grad());
    w2 = (torch::randn({32, 32}) * 0.2).requires_grad_();
  }
  at::Tensor forward(const at::Tensor& in) const {
    auto h = torch::conv2d(in, conv, {}, 1, 1).flatten(1);  // [2, 144]
    h = torch::addmm(b1, h, w1).relu();                     // [2, 32]
    h = h.mm(w2).tanh().mm(w2);                             // two mm
    auto q = h.view({2, 1, 4, 8});
    auto att = torch::scaled_dot_product_attention(q, q, q).reshape({2, 4, 8});
    auto scores = torch::bmm(att, att.transpose(1, 2));  // [2, 4, 4]
    return std::get<0>(scores.flatten(1).topk(3, 1)).sum() + scores.max() + att.sin().sum();
  }
  std::vector<at::Tensor> params() const { return {conv, w1, b1, w2}; }
  at::Tensor x, conv, w1, b1, w2;
};

std::map<std::string, sac::Policy> every_policy() {
  return {
      {"nothing_saveable", sac::nothing_saveable()},
      {"everything_saveable", sac::everything_saveable()},
      {"compute_intensive_ops", sac::compute_intensive_ops()},
      {"torchtitan_default", sac::torchtitan_default()},
      {"dots_saveable", sac::dots_saveable()},
      {"dots_with_no_batch_dims_saveable", sac::dots_with_no_batch_dims_saveable()},
      {"offload_dot_with_no_batch_dims", sac::offload_dot_with_no_batch_dims()},
      {"outputs_larger_than", sac::outputs_larger_than(64)},
      {"never_recompute_collectives",
       sac::any_of({sac::Policy::save_ops({"aten::bmm"}), sac::never_recompute_collectives()})},
      {"any_of", sac::any_of({sac::dots_saveable(), sac::Policy::save_ops({"aten::relu"})})},
      {"all_of", sac::all_of({sac::everything_saveable(), sac::outputs_larger_than(32)})},
      {"except", sac::except(sac::everything_saveable(), sac::Policy::save_ops({"aten::tanh"}))},
      {"every_nth", sac::every_nth("aten::mm", 2)},
      {"for_shapes", sac::for_shapes(sac::everything_saveable(),
                                     [](c10::IntArrayRef s) { return s.size() == 2; })},
      {"offload_if", sac::offload_if(sac::everything_saveable(), int64_t{100})},
  };
}

// Offload answers on a CPU-only machine: copies in memory of their own.
class Copies final : public sac::CopyTarget {
 public:
  bool accepts(const at::Tensor&) const override { return true; }
  at::Tensor copy_out(const at::Tensor& t) override {
    ++copies;
    return at::empty_strided(t.sizes(), t.strides(), t.options()).copy_(t);
  }
  at::Tensor copy_back(const at::Tensor& c, const sac::CopyTarget::Origin& from) override {
    return at::empty_strided(c.sizes(), from.strides, c.options().device(from.device)).copy_(c);
  }
  int copies = 0;
};

TEST_F(Vocabulary, EveryPolicyGivesBitIdenticalGradientsThroughCheckpointAndScope) {
  const Model m;
  const auto expected = run_and_grad([&] { return m.forward(m.x); }, {m.x}, m.params());
  for (const auto& [name, policy] : every_policy()) {
    SCOPED_TRACE(name);
    auto copies = std::make_shared<Copies>();
    const auto options = sac::CheckpointOptions().policy(policy).offload_to(copies);
    const auto actual = run_and_grad(
        [&] {
          return sac::checkpoint(
              options, [&](const at::Tensor& in) { return m.forward(in); }, m.x);
        },
        {m.x}, m.params());
    expect_bit_identical(expected, actual);
    if (name.find("offload") != std::string::npos) {
      EXPECT_GT(copies->copies, 0) << "offload answers went to the target";
    }
    // The same policy from a scope.
    const auto scoped = run_and_grad(
        [&] {
          sac::CheckpointScope scope(options);
          return sac::checkpoint([&](const at::Tensor& in) { return m.forward(in); }, m.x);
        },
        {m.x}, m.params());
    expect_bit_identical(expected, scoped);
  }
}

}  // namespace policy_presets_test
