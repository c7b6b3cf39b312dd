// The six answers of a policy, offload as a per-op answer, GraphExecGroup,
// and nested selective regions with policies of their own. Bytes are counted
// exactly: the device is the counting allocator; offloaded outputs go to a
// HostArena outside it.
#include "support.h"

#include "examples/host_arena.h"

#include <sac/policy/internal/answers.h>

#include <functional>
#include <memory>
#include <vector>

namespace policy_answers_test {

using sac_examples::HostArena;
using sac_test::CountingAllocator;
using sac_test::error_of;
using sac_test::expect_bit_identical;
using sac_test::run_and_grad;

constexpr int64_t kFloat = 4;

struct Chain {
  Chain() {
    torch::manual_seed(0);
    x = torch::randn({16, 32}, torch::requires_grad());
    w1 = (torch::randn({32, 64}) * 0.2).requires_grad_();
    w2 = (torch::randn({64, 32}) * 0.2).requires_grad_();
  }
  // Two matmuls, [16, 64] and [16, 32] floats, with a relu between them.
  at::Tensor forward(const at::Tensor& in) const { return in.mm(w1).relu().mm(w2).tanh(); }
  at::Tensor x, w1, w2;
};

constexpr int64_t kMatmulBytes = (16 * 64 + 16 * 32) * kFloat;

// Bytes live after the forward beyond its output, and the gradients.
struct Outcome {
  int64_t kept = 0;
  std::vector<at::Tensor> grads;
};

Outcome run(const Chain& c, const sac::CheckpointOptions& options) {
  Outcome out;
  const int64_t base = CountingAllocator::live_bytes();
  at::Tensor y = sac::checkpoint(
      options, [&](const at::Tensor& in) { return c.forward(in); }, c.x);
  out.kept = CountingAllocator::live_bytes() - base - static_cast<int64_t>(y.nbytes());
  out.grads = torch::autograd::grad({y.sum()}, {c.x, c.w1, c.w2});
  out.grads.insert(out.grads.begin(), y.detach());
  return out;
}

std::vector<at::Tensor> plain(const Chain& c) {
  return run_and_grad([&] { return c.forward(c.x); }, {c.x}, {c.w1, c.w2});
}

class Answers : public ::testing::Test {
 protected:
  void SetUp() override {
    sac_test::expect_configured_mechanism();
    CountingAllocator::install();
    at::set_num_threads(1);
  }
};

sac::Policy matmuls(sac::CheckpointPolicy answer) {
  return sac::Policy::answer_ops({"aten::mm"}, answer);
}

// Every answer, through sac::checkpoint: save keeps the matmuls on the
// device, offload in the target, recompute nowhere. Must and Prefer act
// alike. Gradients are bit-identical throughout.
TEST_F(Answers, EachOfTheSixAnswersKeepsWhatItSays) {
  const Chain c;
  const auto expected = run_and_grad([&] { return c.forward(c.x); }, {c.x}, {c.w1, c.w2}, 0);
  const Outcome none = run(c, sac::CheckpointOptions().policy(sac::nothing_saveable()));
  for (const auto answer :
       {sac::CheckpointPolicy::MustSave, sac::CheckpointPolicy::PreferSave,
        sac::CheckpointPolicy::MustRecompute, sac::CheckpointPolicy::PreferRecompute,
        sac::CheckpointPolicy::MustCpuOffload, sac::CheckpointPolicy::PreferCpuOffload}) {
    SCOPED_TRACE(std::string(sac::to_string(answer)));
    auto arena = std::make_shared<HostArena>();
    const Outcome out = run(c, sac::CheckpointOptions().policy(matmuls(answer)).offload_to(arena));
    EXPECT_EQ(out.kept, none.kept + (sac::detail::is_save(answer) ? kMatmulBytes : 0));
    EXPECT_EQ(arena->copies(), sac::detail::is_offload(answer) ? 2 : 0);
    EXPECT_EQ(arena->returns(), sac::detail::is_offload(answer) ? 2 : 0);
    EXPECT_EQ(arena->held(), 0) << "the backward freed the graph and the copies with it";
    ASSERT_EQ(out.grads.size(), 4u);
    for (size_t i = 0; i < out.grads.size(); ++i) {
      EXPECT_TRUE(torch::equal(out.grads[i], expected[i])) << "tensor " << i;
    }
  }
}

// The copies are made during the forward (the device memory goes at once)
// and come back when the recomputation starts, before its first op.
TEST_F(Answers, OffloadCopiesOutInForwardAndPrefetchesAtTheStartOfTheRecomputation) {
  const Chain c;
  const auto expected = plain(c);
  auto arena = std::make_shared<HostArena>();
  std::vector<int64_t> returned_at_start;  // arena->returns() as each pass starts
  std::vector<int64_t> held_after_first_mm;
  const auto options = sac::CheckpointOptions()
                           .policy(matmuls(sac::CheckpointPolicy::PreferCpuOffload))
                           .offload_to(arena);
  int64_t kept = 0;
  const auto actual = run_and_grad(
      [&] {
        const int64_t base = CountingAllocator::live_bytes();
        auto y = sac::checkpoint(
            options,
            [&](const at::Tensor& in) {
              returned_at_start.push_back(arena->returns());
              auto h = in.mm(c.w1);
              held_after_first_mm.push_back(arena->held());
              return h.relu().mm(c.w2).tanh();
            },
            c.x);
        kept = CountingAllocator::live_bytes() - base - static_cast<int64_t>(y.nbytes());
        EXPECT_EQ(arena->held(), kMatmulBytes);
        return y;
      },
      {c.x}, {c.w1, c.w2});
  expect_bit_identical(expected, actual);
  EXPECT_EQ(kept, 0) << "nothing of the region stays on the device";
  ASSERT_EQ(returned_at_start.size(), 2u);
  EXPECT_EQ(returned_at_start[0], 0);
  EXPECT_EQ(returned_at_start[1], 2) << "both copies came back before the recomputation ran";
  ASSERT_EQ(held_after_first_mm.size(), 2u);
  EXPECT_EQ(held_after_first_mm[0], 16 * 64 * kFloat) << "copied out as the op ran";
}

// host_memory() takes accelerator tensors only: a CPU output answered
// offload is saved where it is (it is in host memory already).
TEST_F(Answers, OffloadOfACpuTensorToHostMemorySavesItInPlace) {
  const Chain c;
  const Outcome saved =
      run(c, sac::CheckpointOptions().policy(matmuls(sac::CheckpointPolicy::MustSave)));
  const Outcome offloaded =
      run(c, sac::CheckpointOptions().policy(matmuls(sac::CheckpointPolicy::MustCpuOffload)));
  EXPECT_EQ(offloaded.kept, saved.kept);
  expect_bit_identical(saved.grads, offloaded.grads);
}

// An offloaded output modified in place after the forward: the copy is
// stale, and the recomputation that needs it says so, as for a saved one.
TEST_F(Answers, OffloadedOutputModifiedAfterTheForwardIsAnError) {
  const Chain c;
  auto arena = std::make_shared<HostArena>();
  auto out = sac::checkpoint(
      sac::CheckpointOptions()
          .policy(matmuls(sac::CheckpointPolicy::MustCpuOffload))
          .offload_to(arena),
      [&](const at::Tensor& in) {
        auto h = in.mm(c.w1);
        return std::vector<at::Tensor>{h, h.relu().mm(c.w2)};
      },
      c.x);
  {
    torch::NoGradGuard no_grad;
    out[0].add_(1);  // the first matmul's output, which the relu reads again
  }
  const auto msg = error_of([&] { torch::autograd::grad({out[1].sum()}, {c.w2}); });
  EXPECT_NE(msg.find("was modified in place after the checkpointed forward"), std::string::npos)
      << msg;
}

// LibTorch's nn::Linear on 3-D input runs mm, then adds its bias in place
// through an _unsafe_view of the mm's output: the offloaded copy no longer
// holds what the forward used, so the call is recomputed (the storage is
// watched although the device copy is gone).
TEST_F(Answers, OffloadedMatmulOfA3DLinearIsRecomputedAndGradientsMatch) {
  torch::manual_seed(0);
  torch::nn::Linear fc1(16, 32), fc2(32, 16);
  auto x = torch::randn({4, 8, 16}, torch::requires_grad());
  auto f = [&](const at::Tensor& in) { return fc2->forward(torch::gelu(fc1->forward(in))).tanh(); };
  std::vector<at::Tensor> params = fc1->parameters();
  for (const auto& p : fc2->parameters()) params.push_back(p);
  const auto expected = run_and_grad([&] { return f(x); }, {x}, params);
  auto arena = std::make_shared<HostArena>();
  const auto actual = run_and_grad(
      [&] {
        return sac::checkpoint(sac::CheckpointOptions()
                                   .policy(matmuls(sac::CheckpointPolicy::MustCpuOffload))
                                   .offload_to(arena),
                               f, x);
      },
      {x}, params);
  expect_bit_identical(expected, actual);
  EXPECT_EQ(arena->copies(), 2);
  EXPECT_EQ(arena->returns(), 0) << "both calls were demoted: nothing came back";
}

TEST_F(Answers, OffloadToAnAcceleratorsHostMemory) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device";
  }
  torch::manual_seed(0);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  auto x = torch::randn({64, 128}, cuda.requires_grad(true));
  auto w = torch::randn({128, 128}, cuda.requires_grad(true));
  auto f = [&](const at::Tensor& in) { return in.mm(w).relu().mm(w).tanh(); };
  const auto expected = run_and_grad([&] { return f(x); }, {x}, {w});
  const auto actual = run_and_grad(
      [&] {
        return sac::checkpoint(
            sac::CheckpointOptions().policy(matmuls(sac::CheckpointPolicy::MustCpuOffload)), f, x);
      },
      {x}, {w});
  expect_bit_identical(expected, actual);
}

// ---- GraphExecGroup ------------------------------------------------------------

// A region with two outputs whose backward passes need different saved
// tensors; `runs` counts the function's runs (the forward and each
// recomputation).
struct TwoHeads {
  TwoHeads() {
    torch::manual_seed(0);
    x = torch::randn({8}, torch::requires_grad());
    w1 = torch::randn({8}, torch::requires_grad());
    w2 = torch::randn({8}, torch::requires_grad());
  }
  std::vector<at::Tensor> forward() {
    return sac::checkpoint(
        [this](const at::Tensor& in) {
          ++runs;
          return std::vector<at::Tensor>{(in.sin() * w1).sum(), (in.exp() * w2).sum()};
        },
        x);
  }
  at::Tensor x, w1, w2;
  int runs = 0;
};

TEST_F(Answers, GraphExecGroupRecomputesOnceForSeveralBackwardCalls) {
  TwoHeads plain_heads;
  const auto ref1 =
      torch::autograd::grad({(plain_heads.x.sin() * plain_heads.w1).sum()}, {plain_heads.w1});
  const auto ref2 =
      torch::autograd::grad({(plain_heads.x.exp() * plain_heads.w2).sum()}, {plain_heads.w2});

  TwoHeads without;
  auto out = without.forward();
  torch::autograd::grad({out[0]}, {without.w1}, {}, /*retain_graph=*/true);
  torch::autograd::grad({out[1]}, {without.w2});
  EXPECT_EQ(without.runs, 3) << "each backward pass recomputes";

  TwoHeads grouped;
  out = grouped.forward();
  std::vector<at::Tensor> g1, g2;
  {
    sac::GraphExecGroup group;
    g1 = torch::autograd::grad({out[0]}, {grouped.w1}, {}, /*retain_graph=*/true);
    g2 = torch::autograd::grad({out[1]}, {grouped.w2});
  }
  EXPECT_EQ(grouped.runs, 2) << "one recomputation for the group";
  EXPECT_TRUE(torch::equal(g1[0], ref1[0]));
  EXPECT_TRUE(torch::equal(g2[0], ref2[0]));
}

TEST_F(Answers, GraphExecGroupRejectsOverlappingBackwardCalls) {
  TwoHeads heads;
  auto out = heads.forward();
  sac::GraphExecGroup group;
  torch::autograd::grad({out[0]}, {heads.w1}, {}, /*retain_graph=*/true);
  const auto msg = error_of([&] { torch::autograd::grad({out[0]}, {heads.w1}); });
  EXPECT_NE(msg.find("unpacked a second time"), std::string::npos) << msg;
  EXPECT_NE(msg.find("do not overlap"), std::string::npos) << msg;
}

TEST_F(Answers, GraphExecGroupsDoNotNest) {
  sac::GraphExecGroup outer;
  const auto msg = error_of([] { sac::GraphExecGroup inner; });
  EXPECT_NE(msg.find("cannot be nested"), std::string::npos) << msg;
  EXPECT_TRUE(sac::GraphExecGroup::current_id().has_value()) << "the outer group is still active";
}

TEST_F(Answers, GraphExecGroupEndsWithItsScope) {
  EXPECT_FALSE(sac::GraphExecGroup::current_id().has_value());
  { sac::GraphExecGroup group; }
  EXPECT_FALSE(sac::GraphExecGroup::current_id().has_value());
  sac::GraphExecGroup again;  // a new group after the first ended
}

// ---- Nested selective regions, each with its own policy ---------------------

// Runs `f(x, checkpointed)` plain and inside a region with `outer`, expects
// bit-identical gradients, and returns the bytes the region's forward kept.
int64_t kept_by_nested(
    const sac::CheckpointOptions& outer,
    const std::function<at::Tensor(const at::Tensor&, bool)>& f, const at::Tensor& x,
    const std::vector<at::Tensor>& params, const std::function<void()>& after_forward = [] {}) {
  const auto expected = run_and_grad([&] { return f(x, false); }, {x}, params);
  int64_t kept = 0;
  const auto actual = run_and_grad(
      [&] {
        const int64_t base = CountingAllocator::live_bytes();
        auto y = sac::checkpoint(
            outer, [&](const at::Tensor& in) { return f(in, true); }, x);
        kept = CountingAllocator::live_bytes() - base - static_cast<int64_t>(y.nbytes());
        after_forward();
        return y;
      },
      {x}, params);
  expect_bit_identical(expected, actual);
  return kept;
}

// An op belongs to the innermost selective region: the outer policy decides
// the outer region's own ops, the inner policy the inner region's. Bytes
// kept: the outer region's saved matmuls and the inner region's saved relu,
// nothing else.
TEST_F(Answers, NestedRegionsEachKeepWhatTheirOwnPolicySays) {
  torch::manual_seed(0);
  auto x = torch::randn({16, 32}, torch::requires_grad());
  auto w1 = (torch::randn({32, 48}) * 0.2).requires_grad_();
  auto w2 = (torch::randn({48, 48}) * 0.2).requires_grad_();
  auto w3 = (torch::randn({48, 24}) * 0.2).requires_grad_();
  const auto outer = sac::CheckpointOptions().policy(sac::Policy::save_ops({"aten::mm"}));
  const auto inner = sac::CheckpointOptions().policy(sac::Policy::save_ops({"aten::relu"}));
  auto inner_fn = [&](const at::Tensor& h) { return h.mm(w2).relu().mm(w2).sin(); };
  auto f = [&](const at::Tensor& in, bool checkpointed) {
    auto h = in.mm(w1);  // outer: saved
    auto g = checkpointed ? sac::checkpoint(inner, inner_fn, h) : inner_fn(h);
    return g.tanh().mm(w3).cos();  // outer: the mm is saved
  };
  const int64_t kept = kept_by_nested(outer, f, x, {w1, w2, w3});
  // Outer: h [16, 48] and the last mm [16, 24]; inner: the relu [16, 48].
  // The inner matmuls are the inner policy's to decide: recomputed.
  EXPECT_EQ(kept, (16 * 48 + 16 * 24 + 16 * 48) * kFloat);
}

// The same with the policies swapped between the levels, and with the inner
// region offloading: each level's answers hold for its own ops only.
TEST_F(Answers, NestedRegionsWithOffloadInsideAndSaveOutside) {
  torch::manual_seed(0);
  auto x = torch::randn({16, 32}, torch::requires_grad());
  auto w1 = (torch::randn({32, 32}) * 0.2).requires_grad_();
  auto arena = std::make_shared<HostArena>();
  const auto outer = sac::CheckpointOptions().policy(sac::Policy::save_ops({"aten::relu"}));
  const auto inner = sac::CheckpointOptions()
                         .policy(matmuls(sac::CheckpointPolicy::MustCpuOffload))
                         .offload_to(arena);
  auto inner_fn = [&](const at::Tensor& h) { return h.mm(w1).relu().mm(w1); };
  auto f = [&](const at::Tensor& in, bool checkpointed) {
    auto h = in.relu();  // outer: saved
    auto g = checkpointed ? sac::checkpoint(inner, inner_fn, h) : inner_fn(h);
    return g.relu().sum(1);  // outer: saved
  };
  const int64_t kept = kept_by_nested(outer, f, x, {w1}, [&] {
    EXPECT_EQ(arena->held(), 2 * 16 * 32 * kFloat) << "the inner matmuls";
  });
  EXPECT_EQ(kept, 2 * 16 * 32 * kFloat) << "the outer relus; the inner relu is recomputed";
}

}  // namespace policy_answers_test
