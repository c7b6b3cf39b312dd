// sac::CheckpointRegion: any code between a guard's construction and
// destruction is checkpointed; backward replays the recorded aten calls below
// autograd. Gradients must be bit-identical to the plain run.
#include "support.h"

#include <sac/cache/internal/op_cache.h>
#include <sac/dispatch/internal/interceptor.h>
#include <sac/cache/internal/selective_modes.h>

#include <thread>

namespace checkpoint_region_test {

using sac_test::error_of;
using sac_test::expect_bit_identical;
using sac_test::run_and_grad;

// The region needs the fallback key; under per-op kernels every test checks
// the error instead.
bool region_available() {
  sac_test::expect_configured_mechanism();
  return sac::detail::observers_see_every_op();
}

#define REQUIRE_REGION()                                                                      \
  if (!region_available()) {                                                                  \
    const auto message = error_of([] { sac::CheckpointRegion region; });                      \
    EXPECT_NE(message.find("fallback-key dispatch mechanism"), std::string::npos) << message; \
    EXPECT_NE(message.find("sac::checkpoint(fn"), std::string::npos) << message;              \
    return;                                                                                   \
  }

// Runs `f` inside a region with `options`.
template <class F>
auto in_region(const sac::CheckpointOptions& options, F&& f) {
  sac::CheckpointRegion region(options);
  return f();
}

enum class PolicyKind { FullRecompute, SaveMatmuls, SaveEverything, EveryOtherMatmul };

std::string name_of(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::FullRecompute: return "FullRecompute";
    case PolicyKind::SaveMatmuls: return "SaveMatmuls";
    case PolicyKind::SaveEverything: return "SaveEverything";
    case PolicyKind::EveryOtherMatmul: return "EveryOtherMatmul";
  }
  return "?";
}

sac::CheckpointOptions options_for(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::FullRecompute: return {};
    case PolicyKind::SaveMatmuls:
      return sac::CheckpointOptions().policy(sac::Policy::save_ops({"aten::mm", "aten::addmm"}));
    case PolicyKind::SaveEverything:
      return sac::CheckpointOptions().policy(sac::Policy::from_fn(
          [](const sac::SelectiveCheckpointContext&, const c10::OperatorHandle&,
             c10::ArrayRef<c10::IValue>) { return sac::CheckpointPolicy::MustSave; }));
    case PolicyKind::EveryOtherMatmul: {
      auto count = std::make_shared<int>(0);
      return sac::CheckpointOptions().policy(
          sac::Policy::from_fn([count](const sac::SelectiveCheckpointContext&,
                                       const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue>) {
            const auto& name = op.operator_name().name;
            return (name == "aten::mm" || name == "aten::addmm") && (*count)++ % 2 == 0;
          }));
    }
  }
  return {};
}

class RegionGradients : public ::testing::TestWithParam<PolicyKind> {};

TEST_P(RegionGradients, Mlp) {
  REQUIRE_REGION();
  torch::manual_seed(0);
  sac_test::Mlp mlp(32, 64, 16, 4);
  auto x = torch::randn({8, 32}, torch::requires_grad());
  const auto params = mlp->parameters();
  const auto expected = run_and_grad([&] { return mlp->forward(x); }, {x}, params);
  const auto actual = run_and_grad(
      [&] { return in_region(options_for(GetParam()), [&] { return mlp->forward(x); }); }, {x},
      params);
  expect_bit_identical(expected, actual);
}

TEST_P(RegionGradients, GptBlockWithDropout) {
  REQUIRE_REGION();
  torch::manual_seed(0);
  sac_test::GptBlock block(32, 4, /*dropout=*/0.1);
  auto x = torch::randn({2, 16, 32}, torch::requires_grad());
  const auto params = block->parameters();
  const auto expected = run_and_grad([&] { return block->forward(x); }, {x}, params);
  const auto actual = run_and_grad(
      [&] { return in_region(options_for(GetParam()), [&] { return block->forward(x); }); }, {x},
      params);
  expect_bit_identical(expected, actual);
}

// Two regions in one step: the second's replay and the first's run in the
// same backward; the second reads the first's output from outside.
TEST_P(RegionGradients, StackedGptBlocks) {
  REQUIRE_REGION();
  torch::manual_seed(0);
  sac_test::GptBlock a(32, 4, 0.1), b(32, 4, 0.1);
  auto x = torch::randn({2, 8, 32}, torch::requires_grad());
  auto params = a->parameters();
  for (const auto& p : b->parameters()) params.push_back(p);
  const auto expected = run_and_grad([&] { return b->forward(a->forward(x)); }, {x}, params);
  const auto actual = run_and_grad(
      [&] {
        auto h = in_region(options_for(GetParam()), [&] { return a->forward(x); });
        return in_region(options_for(GetParam()), [&] { return b->forward(h); });
      },
      {x}, params);
  expect_bit_identical(expected, actual);
}

// LibTorch's Linear on 3-D input: mm, _unsafe_view, then the bias added in
// place through the view.
TEST_P(RegionGradients, LinearOn3dInput) {
  REQUIRE_REGION();
  torch::manual_seed(0);
  torch::nn::Linear lin(4, 5);
  auto x = torch::randn({3, 2, 4}, torch::requires_grad());
  auto f = [&] { return lin->forward(x.transpose(0, 1)).exp(); };
  const auto expected = run_and_grad(f, {x}, lin->parameters());
  const auto actual =
      run_and_grad([&] { return in_region(options_for(GetParam()), f); }, {x}, lin->parameters());
  expect_bit_identical(expected, actual);
}

INSTANTIATE_TEST_SUITE_P(Policies, RegionGradients,
                         ::testing::Values(PolicyKind::FullRecompute, PolicyKind::SaveMatmuls,
                                           PolicyKind::SaveEverything,
                                           PolicyKind::EveryOtherMatmul),
                         [](const auto& info) { return name_of(info.param); });

struct ConvBnImpl : torch::nn::Module {
  ConvBnImpl() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3)));
    bn = register_module("bn", torch::nn::BatchNorm2d(8));
  }
  at::Tensor forward(const at::Tensor& x) { return torch::relu(bn->forward(conv->forward(x))); }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
};
TORCH_MODULE(ConvBn);

// The running statistics are outside tensors the region writes: the replay
// writes copies, so one forward and backward update them exactly once, to
// the values the plain run gives. sac::checkpoint, like PyTorch's, updates
// them twice.
TEST(Region, BatchNormStatisticsUpdatedOnce) {
  REQUIRE_REGION();
  torch::manual_seed(0);
  ConvBn plain, checkpointed;
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < plain->parameters().size(); ++i) {
      checkpointed->parameters()[i].copy_(plain->parameters()[i]);
    }
  }
  auto x = torch::randn({2, 3, 8, 8}, torch::requires_grad());
  const auto expected = run_and_grad([&] { return plain->forward(x); }, {x}, plain->parameters());
  const auto actual =
      run_and_grad([&] { return in_region({}, [&] { return checkpointed->forward(x); }); }, {x},
                   checkpointed->parameters());
  expect_bit_identical(expected, actual);
  EXPECT_EQ(checkpointed->bn->num_batches_tracked.item<int64_t>(), 1);
  expect_bit_identical({plain->bn->running_mean, plain->bn->running_var},
                       {checkpointed->bn->running_mean, checkpointed->bn->running_var});

  // For comparison: the function-based checkpoint runs BatchNorm twice.
  ConvBn rerun;
  auto y = sac::checkpoint([&](const at::Tensor& in) { return rerun->forward(in); }, x);
  y.sum().backward();
  EXPECT_EQ(rerun->bn->num_batches_tracked.item<int64_t>(), 2);
}

// The branch taken depends on a value the region computes (item()); the
// replay repeats the forward's ops whatever the host state is by then.
TEST(Region, DataDependentControlFlowReplaysTheForwardsBranch) {
  REQUIRE_REGION();
  torch::manual_seed(0);
  auto x = torch::randn({16}, torch::requires_grad());
  auto w = torch::randn({16}, torch::requires_grad());
  bool flip = false;  // host state that changes between forward and backward
  auto f = [&] {
    auto h = x * w;
    const bool positive = h.sum().item<double>() > 0;
    if (positive != flip) {
      h = h.sin() * 2;
    } else {
      h = h.cos().exp();
    }
    for (int i = 0; i < (positive ? 3 : 2); ++i) {
      h = h.tanh() + w;
    }
    return h;
  };
  const auto expected = run_and_grad(f, {x}, {w});
  const auto actual = run_and_grad(
      [&] {
        auto y = in_region({}, f);
        flip = true;  // running f again would now take the other branch
        return y;
      },
      {x}, {w});
  expect_bit_identical(expected, actual);
}

TEST(Region, NestedRegionsAndCheckpoints) {
  REQUIRE_REGION();
  torch::manual_seed(0);
  sac_test::Mlp a(16, 32, 16, 2), b(16, 32, 16, 2), c(16, 32, 16, 2);
  auto x = torch::randn({4, 16}, torch::requires_grad());
  auto params = a->parameters();
  for (auto& p : b->parameters()) params.push_back(p);
  for (auto& p : c->parameters()) params.push_back(p);
  auto plain = [&] { return c->forward(b->forward(a->forward(x)).relu()).sin(); };
  const auto expected = run_and_grad(plain, {x}, params);
  const auto save_mm = sac::CheckpointOptions().policy(sac::Policy::save_ops({"aten::addmm"}));
  // A region holding a region and a sac::checkpoint.
  const auto outer_region = run_and_grad(
      [&] {
        return in_region({}, [&] {
          auto h = in_region(save_mm, [&] { return a->forward(x); });
          h = sac::checkpoint([&](const at::Tensor& in) { return b->forward(in).relu(); }, h);
          return c->forward(h).sin();
        });
      },
      {x}, params);
  expect_bit_identical(expected, outer_region);
  // A sac::checkpoint holding a region.
  const auto outer_checkpoint = run_and_grad(
      [&] {
        return sac::checkpoint(
            save_mm,
            [&](const at::Tensor& in) {
              auto h = b->forward(a->forward(in)).relu();
              return in_region({}, [&] { return c->forward(h).sin(); });
            },
            x);
      },
      {x}, params);
  expect_bit_identical(expected, outer_checkpoint);
}

// Views, in-place ops through views, detach (a tensor no op returned at the
// autograd level) and a tensor filled outside the dispatcher.
// A buffer an enclosing sac::checkpoint overwrites whole, read by a region
// inside it: the enclosing recomputation writes the same bytes again (a new
// version) before the region replays, and the replay's check of versions
// raised "modified in place after the region read it" (found by the fuzzer).
// The region watches such a buffer's bytes (Note [Rewritten by a
// recomputation]); another write, with other bytes, is still an error.
TEST(Region, ABufferAnEnclosingCheckpointOverwritesIsExact) {
  REQUIRE_REGION();
  torch::manual_seed(0);
  auto a = torch::randn({6, 4}, torch::requires_grad());
  at::Tensor buf;
  auto inner = [&](const at::Tensor& h) { return (h * buf).tanh() + h.sin(); };
  auto outer = [&](const at::Tensor& in, bool region) {
    buf.copy_(in.detach().cos());
    const at::Tensor h = in * 3;
    const at::Tensor y = region ? in_region({}, [&] { return inner(h); }) : inner(h);
    // Backwarded first: its saved output recomputes the checkpoint before
    // the region replays.
    return y + h.exp();
  };
  auto step = [&](bool checkpointed) {
    buf = torch::zeros({6, 4});
    return run_and_grad(
        [&] {
          return checkpointed
                     ? sac::checkpoint([&](const at::Tensor& in) { return outer(in, true); }, a)
                     : outer(a, false);
        },
        {a}, {});
  };
  expect_bit_identical(step(false), step(true));
  // The same region after the checkpoint, with the buffer written between.
  buf = torch::zeros({6, 4});
  const at::Tensor first = sac::checkpoint(
      [&](const at::Tensor& in) {
        buf.copy_(in.detach().cos());
        return in * buf.mean();
      },
      a);
  buf.mul_(2);
  const at::Tensor second = in_region({}, [&] { return inner(a * 3); });
  torch::autograd::grad({first.sum()}, {a});
  const std::string message = error_of([&] { torch::autograd::grad({second.sum()}, {a}); });
  EXPECT_NE(message.find("was modified in place after the region read it"), std::string::npos)
      << message;
}

TEST(Region, ViewsInPlaceDetachAndRawMemory) {
  REQUIRE_REGION();
  torch::manual_seed(0);
  auto x = torch::randn({4, 6}, torch::requires_grad());
  auto f = [&] {
    auto h = x * 3;  // saves nothing of h
    auto v = h.view({6, 4}).narrow(0, 1, 3);
    v.mul_(2);            // through a view
    auto d = h.detach();  // aliases h, made above the recorder
    auto index = torch::tensor(std::vector<int64_t>{2, 0, 1});  // memcpy into at::empty
    auto picked = h.index_select(0, index) * d.index_select(0, index).sigmoid();
    return picked.cumsum(1).pow(2);
  };
  const auto expected = run_and_grad(f, {x}, {});
  const auto actual = run_and_grad([&] { return in_region({}, f); }, {x}, {});
  expect_bit_identical(expected, actual);
}

// torch::autograd::grad inside the region; its result feeds the output.
TEST(Region, GradInsideTheRegion) {
  REQUIRE_REGION();
  torch::manual_seed(0);
  auto x = torch::randn({8}, torch::requires_grad());
  auto w = torch::randn({8}, torch::requires_grad());
  auto f = [&] {
    auto h = (x * w).sin();
    auto g = torch::autograd::grad({h.sum()}, {w}, {}, /*retain_graph=*/true,
                                   /*create_graph=*/true)[0];
    return (h * g).cos();
  };
  const auto expected = run_and_grad(f, {x}, {w});
  const auto actual = run_and_grad([&] { return in_region({}, f); }, {x}, {w});
  expect_bit_identical(expected, actual);
}

// A random op with an explicit generator: the replay draws the forward's
// numbers, and the generator is left where the forward left it.
TEST(Region, ExplicitGenerator) {
  REQUIRE_REGION();
  auto x = torch::randn({64}, torch::requires_grad());
  auto generator = at::make_generator<at::CPUGeneratorImpl>(7);
  auto f = [&] {
    auto noise = at::empty({64}).uniform_(0, 1, generator);
    return (x * noise).sin();
  };
  generator.set_current_seed(7);
  const auto expected = run_and_grad(f, {x}, {});
  const auto after_plain = generator.get_state();
  generator.set_current_seed(7);
  const auto actual = run_and_grad([&] { return in_region({}, f); }, {x}, {});
  expect_bit_identical(expected, actual);
  expect_bit_identical({after_plain}, {generator.get_state()});
}

TEST(Region, OutsideTensorModifiedBeforeBackwardIsAnError) {
  REQUIRE_REGION();
  auto x = torch::randn({4}, torch::requires_grad());
  auto buffer = torch::randn({4});
  auto y = in_region({}, [&] { return (x * buffer).sin(); });
  buffer.add_(1);
  const auto message = error_of([&] { y.sum().backward(); });
  EXPECT_NE(message.find("was modified in place after the region read it"), std::string::npos)
      << message;
  EXPECT_NE(message.find("sac::CheckpointRegion"), std::string::npos) << message;
  // First seen below autograd (relu saves nothing of a tensor without
  // grad), and inside a nested region.
  auto z = in_region({}, [&] {
    auto inner = in_region({}, [&] { return buffer.relu(); });
    return (x * inner).sin();
  });
  buffer.add_(1);
  const auto nested = error_of([&] { z.sum().backward(); });
  EXPECT_NE(nested.find("was modified in place after the region read it"), std::string::npos)
      << nested;
}

// A trace in the region (torch.compile's fake tensors are meta tensors
// underneath) is refused as such, not as an op the recording cannot follow;
// the region leaves nothing behind.
TEST(Region, ATraceInsideIsRefusedAsOne) {
  REQUIRE_REGION();
  auto x = torch::randn({4}, torch::requires_grad());
  const auto message = error_of([&] {
    sac::CheckpointRegion region;
    (void)(x * 2).sin();
    (void)torch::empty({4}, torch::kMeta).sin();
  });
  EXPECT_NE(message.find("sac::CheckpointRegion: the region runs aten::"), std::string::npos)
      << message;
  EXPECT_NE(message.find("as part of a compile trace"), std::string::npos) << message;
  EXPECT_NE(message.find("torch.compile is not supported inside it"), std::string::npos) << message;
  EXPECT_EQ(sac::detail::active_interceptor(), nullptr);
}

// An exception inside the region: nothing stays active on the thread, the
// recording's memory is freed, and a later region works.
TEST(Region, ExceptionLeavesNoStateAndNoMemory) {
  REQUIRE_REGION();
  sac_examples::CountingAllocator::install();
  auto x = torch::randn({32, 32}, torch::requires_grad());
  const auto before = sac_examples::CountingAllocator::live_bytes();
  at::Tensor escaped;
  EXPECT_THROW(
      {
        sac::CheckpointRegion region(
            sac::CheckpointOptions().policy(sac::Policy::save_ops({"aten::mm"})));
        auto h = x.mm(x).sin();
        escaped = h.exp();
        (void)h.mm(torch::ones({3, 3}));  // shapes do not match
      },
      c10::Error);
  EXPECT_EQ(sac::detail::active_interceptor(), nullptr);
  const auto message = error_of([&] { escaped.sum().backward(); });
  EXPECT_NE(message.find("ended with an exception"), std::string::npos) << message;
  escaped.reset();
  EXPECT_EQ(sac_examples::CountingAllocator::live_bytes(), before);
  const auto expected = run_and_grad([&] { return x.mm(x).sin(); }, {x}, {});
  const auto actual =
      run_and_grad([&] { return in_region({}, [&] { return x.mm(x).sin(); }); }, {x}, {});
  expect_bit_identical(expected, actual);
}

TEST(Region, NoGradDoesNothing) {
  REQUIRE_REGION();
  torch::NoGradGuard no_grad;
  auto x = torch::randn({4});
  auto y = in_region({}, [&] { return x.sin(); });
  EXPECT_FALSE(y.requires_grad());
}

// Many training steps: parameters after SGD are bit-identical.
TEST(Region, TrainingIterations) {
  REQUIRE_REGION();
  torch::manual_seed(0);
  sac_test::GptBlock plain(32, 4, 0.1), checkpointed(32, 4, 0.1);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < plain->parameters().size(); ++i) {
      checkpointed->parameters()[i].copy_(plain->parameters()[i]);
    }
  }
  torch::optim::SGD plain_opt(plain->parameters(), 0.05),
      ckpt_opt(checkpointed->parameters(), 0.05);
  const auto policy = sac::Policy::save_ops({"aten::addmm"});
  for (int step = 0; step < 10; ++step) {
    auto x = torch::randn({2, 8, 32});
    torch::manual_seed(100 + step);
    plain_opt.zero_grad();
    plain->forward(x).pow(2).mean().backward();
    plain_opt.step();
    torch::manual_seed(100 + step);
    ckpt_opt.zero_grad();
    at::Tensor y;
    {
      sac::CheckpointRegion region(sac::CheckpointOptions().policy(policy));
      y = checkpointed->forward(x);
    }
    y.pow(2).mean().backward();
    ckpt_opt.step();
  }
  expect_bit_identical(plain->parameters(), checkpointed->parameters());
}

// The replay stops once the last holder is filled: ops after the last
// saved tensor are not replayed. Every op's output is cached; the calls the
// replay did not serve are freed when it ends, not with the region.
TEST(Region, EarlyStopEndsTheReplayAtTheLastSavedTensor) {
  REQUIRE_REGION();
  auto x = torch::randn({8}, torch::requires_grad());
  auto replayed_calls = [&](bool early_stop) {
    std::shared_ptr<sac::detail::OpCache> cache;
    auto stats = std::make_shared<sac::RegionStatistics>();
    auto options = sac::CheckpointOptions()
                       .context_fn([&cache, stats] {
                         auto contexts = sac::create_selective_checkpoint_contexts(
                             sac::everything_saveable(), false, nullptr, stats);
                         cache = sac::detail::cache_of(contexts);
                         return sac::RegionContexts(contexts);
                       })
                       .early_stop(early_stop);
    auto y = in_region(options, [&] {
      // sin saves x, exp its output; the last three ops save nothing.
      auto h = x.sin().exp();
      return ((h * 2) + 1).neg();
    });
    EXPECT_EQ(cache->kept_calls(), 5u);
    EXPECT_GT(cache->bytes(), 0u);
    y.sum().backward({}, /*retain_graph=*/true);
    EXPECT_EQ(cache->kept_calls(), 0u);
    EXPECT_EQ(cache->bytes(), 0u);
    return static_cast<int>(stats->read().calls_served);
  };
  // exp saves its output: the replay stops right after it.
  EXPECT_EQ(replayed_calls(/*early_stop=*/true), 2);
  EXPECT_EQ(replayed_calls(/*early_stop=*/false), 5);
}

// Regions on several threads at once: each thread records and replays its
// own, and backward may run on another thread than the forward.
TEST(Region, Threads) {
  REQUIRE_REGION();
  auto run = [](int seed, bool backward_elsewhere, std::vector<at::Tensor>* expected,
                std::vector<at::Tensor>* actual) {
    torch::manual_seed(seed);
    sac_test::GptBlock block(16, 2, /*dropout=*/0.0);  // one global generator
    auto x = torch::randn({2, 8, 16}, torch::requires_grad());
    const auto params = block->parameters();
    *expected = run_and_grad([&] { return block->forward(x); }, {x}, params, seed);
    torch::manual_seed(seed);
    at::Tensor y;
    {
      sac::CheckpointRegion region(
          sac::CheckpointOptions().policy(sac::Policy::save_ops({"aten::addmm"})));
      y = block->forward(x);
    }
    std::vector<at::Tensor> inputs{x};
    inputs.insert(inputs.end(), params.begin(), params.end());
    auto grad = [&] { *actual = torch::autograd::grad({y.sum()}, inputs); };
    if (backward_elsewhere) {
      std::thread(grad).join();
    } else {
      grad();
    }
    actual->insert(actual->begin(), y);
  };
  std::vector<std::vector<at::Tensor>> expected(4), actual(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back(run, 10 + i, i % 2 == 1, &expected[i], &actual[i]);
  }
  for (auto& t : threads) {
    t.join();
  }
  for (int i = 0; i < 4; ++i) {
    expect_bit_identical(expected[i], actual[i]);
  }
}

// ---- Memory, in exact bytes ------------------------------------------------

class RegionMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    sac_examples::CountingAllocator::install();
    torch::manual_seed(0);
    mlp = sac_test::Mlp(32, 64, 16, /*depth=*/4);
    x = torch::randn({8, 32}, torch::requires_grad());
  }
  static int64_t live() { return sac_examples::CountingAllocator::live_bytes(); }

  sac_test::Mlp mlp{nullptr};
  at::Tensor x;
};

// Nothing but the output stays after the forward; backward, or dropping the
// graph, frees everything the region kept.
TEST_F(RegionMemory, FullRecomputeKeepsOnlyTheOutput) {
  REQUIRE_REGION();
  const int64_t base = live();
  {
    auto y = in_region({}, [&] { return mlp->forward(x); });
    EXPECT_EQ(live() - base, 8 * 16 * 4);
  }
  EXPECT_EQ(live(), base) << "dropping the graph freed everything";
  {
    auto y = in_region({}, [&] { return mlp->forward(x); });
    torch::autograd::grad({y.sum()}, {x});
  }
  EXPECT_EQ(live(), base) << "backward freed everything";
}

// With a policy, exactly what the policy saves is kept, as with
// sac::checkpoint; the same bytes after the forward.
TEST_F(RegionMemory, SaveMatmulsKeepsExactlyTheMatmulOutputs) {
  REQUIRE_REGION();
  const int64_t base = live();
  auto modes = sac::create_selective_checkpoint_contexts(sac::Policy::save_ops({"aten::addmm"}));
  const auto options =
      sac::CheckpointOptions().context_fn([modes] { return sac::RegionContexts(modes); });
  {
    auto y = in_region(options, [&] { return mlp->forward(x); });
    const int64_t matmul_outputs = (3 * 8 * 64 + 8 * 16) * 4;
    EXPECT_EQ(static_cast<int64_t>(sac::detail::cache_of(modes)->bytes()), matmul_outputs);
    EXPECT_EQ(live() - base, matmul_outputs);
    auto same = sac::checkpoint(
        sac::CheckpointOptions().policy(sac::Policy::save_ops({"aten::addmm"})),
        [&](const at::Tensor& in) { return mlp->forward(in); }, x);
    EXPECT_EQ(live() - base, 2 * matmul_outputs) << "sac::checkpoint keeps as much";
    torch::autograd::grad({y.sum()}, {x});
    EXPECT_EQ(sac::detail::cache_of(modes)->bytes(), 0u);
  }
  EXPECT_EQ(live(), base);
}

// A BatchNorm's running statistics are copied before the region writes
// them: those copies are all the region keeps besides the output.
TEST_F(RegionMemory, BatchNormKeepsCopiesOfItsStatistics) {
  REQUIRE_REGION();
  ConvBn model;
  auto input = torch::randn({2, 3, 8, 8}, torch::requires_grad());
  in_region({}, [&] { return model->forward(input); }).sum().backward();  // warm-up
  const int64_t base = live();
  {
    auto y = in_region({}, [&] { return model->forward(input); });
    const int64_t statistics = 2 * 8 * 4 + 8;  // running mean, var; the batch count
    EXPECT_EQ(live() - base, static_cast<int64_t>(y.storage().nbytes()) + statistics);
    y.sum().backward();
  }
  EXPECT_EQ(live(), base);
}

// Memory from before the region that the region overwrites whole before
// anything reads it (FSDP copies gathered parameters into buffers it made
// earlier, viewing them first) is neither saved nor copied: the replay makes
// it anew. Changing the live buffer before backward (FSDP frees it) changes
// nothing. Memory read before the overwrite is still copied.
TEST_F(RegionMemory, MemoryOverwrittenWholeBeforeAnyReadIsNotKept) {
  REQUIRE_REGION();
  const auto shard = torch::randn({32, 32}, torch::requires_grad());
  const auto forward = [&](const at::Tensor& buffer, bool read_first) {
    at::Tensor h = read_first ? x + buffer.narrow(0, 0, 8) : x;  // read, not saved
    buffer.view({-1});                 // seen first through a view, as FSDP does
    buffer.copy_(shard.detach() * 2);  // every byte written, none read
    const at::Tensor w = buffer + shard - shard.detach();  // the gradient reaches shard
    return torch::tanh(torch::mm(h, w));
  };
  for (const bool read_first : {false, true}) {
    SCOPED_TRACE(read_first ? "read, then overwritten" : "overwritten first");
    const auto expected = sac_test::run_and_grad(
        [&] {
          return forward(torch::ones({32, 32}) / 8, read_first);
        },
        {x}, {shard});
    const at::Tensor buffer = torch::ones({32, 32}) / 8;
    const int64_t base = live();
    at::Tensor y = in_region({}, [&] { return forward(buffer, read_first); });
    const int64_t copy = read_first ? 32 * 32 * 4 : 0;
    EXPECT_EQ(live() - base, static_cast<int64_t>(y.nbytes()) + copy);
    buffer.fill_(7);  // not read again by the replay
    const auto grads = torch::autograd::grad({y.sum()}, {x, shard});
    sac_test::expect_bit_identical({expected[0], expected[1], expected[2]},
                                   {y, grads[0], grads[1]});
  }
}

// The replay keeps a value only until its last use: its peak during
// backward is no higher than that of the function-based recomputation.
TEST_F(RegionMemory, ReplayPeakIsNoHigherThanFunctionRerun) {
  REQUIRE_REGION();
  sac_test::GptBlock block(64, 4, 0.0);
  auto input = torch::randn({4, 32, 64}, torch::requires_grad());
  auto peak_of_backward = [&](const std::function<at::Tensor()>& forward) {
    auto y = forward();
    sac_examples::CountingAllocator::reset_peak();
    const int64_t before = live();
    torch::autograd::grad({y.sum()}, {input});
    return sac_examples::CountingAllocator::peak_bytes() - before;
  };
  for (const auto& options :
       {sac::CheckpointOptions(),
        sac::CheckpointOptions().policy(sac::Policy::save_ops({"aten::addmm"}))}) {
    const int64_t rerun = peak_of_backward([&] {
      return sac::checkpoint(
          options, [&](const at::Tensor& in) { return block->forward(in); }, input);
    });
    const int64_t replay =
        peak_of_backward([&] { return in_region(options, [&] { return block->forward(input); }); });
    EXPECT_LE(replay, rerun);
  }
}

}  // namespace checkpoint_region_test
