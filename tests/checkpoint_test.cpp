// The non-reentrant checkpoint: PyTorch's rules for nesting, retain_graph,
// backward inside the function, early stop, and its errors.
#include "support.h"

#include <sac/check/internal/debug_log.h>
#include <sac/checkpoint/internal/device_state.h>
#include <sac/dispatch/internal/interceptor.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>

#include <atomic>
#include <mutex>
#include <thread>

namespace checkpoint_test {

using sac_test::error_of;
using sac_test::expect_bit_identical;
using sac_test::run_and_grad;

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    sac_test::expect_configured_mechanism();
    torch::manual_seed(0);
    w = torch::randn({16, 16}, torch::requires_grad());
    x = torch::randn({4, 16}, torch::requires_grad());
  }
  at::Tensor w, x;
};

TEST_F(Checkpoint, UnderNoGradJustRunsTheFunction) {
  int calls = 0;
  torch::NoGradGuard no_grad;
  auto y = sac::checkpoint(
      sac::CheckpointOptions().policy(sac::Policy::save_ops({"aten::mm"})),
      [&](const at::Tensor& in) {
        ++calls;
        return in.mm(w);
      },
      x);
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(torch::equal(y, x.mm(w)));
}

TEST_F(Checkpoint, NonTensorArgumentsAndTensorContainers) {
  auto b = torch::randn({16}, torch::requires_grad());
  auto f = [](const at::Tensor& in, double scale, int64_t repeats, const std::string& act,
              const std::vector<at::Tensor>& weights, const std::optional<at::Tensor>& bias,
              const std::optional<at::Tensor>& none) {
    EXPECT_FALSE(none.has_value());
    at::Tensor h = in * scale;
    for (int64_t i = 0; i < repeats; ++i) {
      for (const auto& wt : weights) {
        h = h.mm(wt);
        h = act == "tanh" ? torch::tanh(h) : torch::relu(h);
      }
    }
    return bias ? h + *bias : h;
  };
  auto w2 = torch::randn({16, 16}, torch::requires_grad());
  std::vector<at::Tensor> weights{w, w2};
  const std::optional<at::Tensor> bias = b;
  const std::optional<at::Tensor> none;
  const auto expected =
      run_and_grad([&] { return f(x, 0.5, 2, "tanh", weights, bias, none); }, {x}, {w, w2, b});
  const auto actual = run_and_grad(
      [&] {
        return sac::checkpoint(f, x, 0.5, int64_t{2}, std::string("tanh"), weights, bias, none);
      },
      {x}, {w, w2, b});
  expect_bit_identical(expected, actual);
}

TEST_F(Checkpoint, SeveralOutputsSomeWithoutGrad) {
  auto f = [&](const at::Tensor& in) {
    auto h = torch::tanh(in.mm(w));
    return std::make_tuple(h.exp(), h.argmax(1), (h * 2).detach());
  };
  auto [a, idx, d] = f(x);
  const auto expected = torch::autograd::grad({a.sum()}, {x, w});
  auto [a2, idx2, d2] = sac::checkpoint(f, x);
  EXPECT_TRUE(torch::equal(idx, idx2));
  EXPECT_FALSE(d2.requires_grad());
  EXPECT_FALSE(idx2.requires_grad());
  expect_bit_identical(expected, torch::autograd::grad({a2.sum()}, {x, w}));
}

TEST_F(Checkpoint, VectorOutputs) {
  auto f = [&](const at::Tensor& in) {
    auto h = in.mm(w);
    return std::vector<at::Tensor>{torch::sin(h), torch::cos(h)};
  };
  const auto expected = run_and_grad(
      [&] {
        auto o = f(x);
        return o[0] * o[1];
      },
      {x}, {w});
  const auto actual = run_and_grad(
      [&] {
        auto o = sac::checkpoint(
            sac::CheckpointOptions().policy(sac::Policy::save_ops({"aten::mm"})), f, x);
        return o[0] * o[1];
      },
      {x}, {w});
  expect_bit_identical(expected, actual);
}

// An inner region's inputs are saved tensors of the outer one.
TEST_F(Checkpoint, NestedCheckpointsWithPolicies) {
  auto inner = [&](const at::Tensor& in) { return torch::tanh(in.mm(w)).mm(w); };
  auto outer = [&](const at::Tensor& in) {
    auto h = torch::sigmoid(in.mm(w));
    h = sac::checkpoint(sac::CheckpointOptions().policy(sac::Policy::save_ops({"aten::tanh"})),
                        inner, h);
    return torch::relu(h.mm(w));
  };
  const auto expected = run_and_grad([&] { return outer(x); }, {x}, {w});
  const auto full = run_and_grad([&] { return sac::checkpoint(outer, x); }, {x}, {w});
  expect_bit_identical(expected, full);
  const auto selective = run_and_grad(
      [&] {
        return sac::checkpoint(sac::CheckpointOptions().policy(sac::Policy::save_ops({"aten::mm"})),
                               outer, x);
      },
      {x}, {w});
  expect_bit_identical(expected, selective);
}

// Full recomputation allows retain_graph: each backward recomputes once.
TEST_F(Checkpoint, RetainGraphRecomputesOncePerBackward) {
  int calls = 0;
  auto f = [&](const at::Tensor& in) {
    ++calls;
    return torch::tanh(in.mm(w)).mm(w).exp();
  };
  const auto expected = torch::autograd::grad({f(x).sum()}, {w})[0];
  calls = 0;
  auto y = sac::checkpoint(f, x).sum();
  auto g1 = torch::autograd::grad({y}, {w}, {}, /*retain_graph=*/true)[0];
  auto g2 = torch::autograd::grad({y}, {w})[0];
  EXPECT_EQ(calls, 3) << "one forward and one recomputation per backward";
  EXPECT_TRUE(torch::equal(g1, expected));
  EXPECT_TRUE(torch::equal(g2, expected));
}

TEST_F(Checkpoint, SelectiveRegionBackwardTwiceIsAnError) {
  auto y = sac::checkpoint(
               sac::CheckpointOptions().policy(sac::Policy::save_ops({"aten::mm"})),
               [&](const at::Tensor& in) { return torch::tanh(in.mm(w)).mm(w); }, x)
               .sum();
  torch::autograd::grad({y}, {w}, {}, /*retain_graph=*/true);
  const auto message = error_of([&] { torch::autograd::grad({y}, {w}); });
  EXPECT_NE(message.find("backward an extra time"), std::string::npos) << message;
  EXPECT_NE(message.find("without a policy"), std::string::npos) << message;
}

// Backward (autograd::grad) inside the checkpointed function: a gradient
// penalty.
TEST_F(Checkpoint, GradInsideTheCheckpointedFunction) {
  auto f = [&](const at::Tensor& in) {
    auto h = torch::tanh(in.mm(w));
    auto g = torch::autograd::grad({h.pow(2).sum()}, {in}, {}, /*retain_graph=*/true,
                                   /*create_graph=*/true)[0];
    return h.sum() + g.pow(2).sum();
  };
  const auto expected = run_and_grad([&] { return f(x); }, {x}, {w});
  expect_bit_identical(expected, run_and_grad([&] { return sac::checkpoint(f, x); }, {x}, {w}));
  {
    sac::EarlyStopGuard no_early_stop(false);
    expect_bit_identical(expected, run_and_grad([&] { return sac::checkpoint(f, x); }, {x}, {w}));
  }
}

// Early stop ends the recomputation once the last saved tensor is filled;
// EarlyStopGuard(false) (or .early_stop(false)) runs the function to its end.
TEST_F(Checkpoint, EarlyStop) {
  int reached_end = 0;
  auto f = [&](const at::Tensor& in) {
    auto y = torch::tanh(in.mm(w));
    ++reached_end;  // after the last op that saves a tensor
    return y;
  };
  auto run = [&](const sac::CheckpointOptions& options) {
    reached_end = 0;
    torch::autograd::grad({sac::checkpoint(options, f, x).sum()}, {w});
    return reached_end;
  };
  EXPECT_EQ(run({}), 1) << "the recomputation stopped early";
  EXPECT_EQ(run(sac::CheckpointOptions().early_stop(false)), 2);
  {
    sac::EarlyStopGuard no_early_stop(false);
    EXPECT_EQ(run({}), 2) << "the guard overrides the options";
  }
  EXPECT_EQ(run({}), 1) << "the guard is gone";
}

TEST_F(Checkpoint, RngStatePreservedForDropout) {
  auto f = [&](const at::Tensor& in) { return torch::dropout(in.mm(w), 0.5, true).exp(); };
  const auto expected = run_and_grad([&] { return f(x); }, {x}, {w});
  expect_bit_identical(expected, run_and_grad([&] { return sac::checkpoint(f, x); }, {x}, {w}));
  // Without preserved RNG state the recomputed mask differs.
  const auto unpreserved = run_and_grad(
      [&] { return sac::checkpoint(sac::CheckpointOptions().preserve_rng_state(false), f, x); },
      {x}, {w});
  EXPECT_FALSE(torch::equal(expected[2], unpreserved[2]));
}

TEST_F(Checkpoint, AutocastStateRestoredForRecomputation) {
  auto f = [&](const at::Tensor& in) { return torch::tanh(in.mm(w)).mm(w); };
  auto under_autocast = [&](const std::function<at::Tensor()>& forward) {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::Tensor y;
    try {
      y = forward();
    } catch (...) {
      at::autocast::set_autocast_enabled(at::kCPU, false);
      throw;
    }
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
    EXPECT_EQ(y.scalar_type(), at::kBFloat16);
    return torch::autograd::grad({y.to(at::kFloat).sum()}, {x, w});  // backward outside autocast
  };
  const auto expected = under_autocast([&] { return f(x); });
  expect_bit_identical(expected, under_autocast([&] { return sac::checkpoint(f, x); }));
}

// As PyTorch's checkpoint: with only CPU inputs, CUDA's autocast settings
// are captured too (the inferred device type defaults to CUDA), and a meta
// input is a device type without autocast, not an error.
TEST_F(Checkpoint, AutocastCapturedForTheInferredDeviceType) {
  std::vector<bool> seen;
  auto f = [&](const at::Tensor& in) {
    seen.push_back(at::autocast::is_autocast_enabled(at::kCUDA));
    return in.sin();
  };
  auto y = [&] {
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    struct Off {
      ~Off() { at::autocast::set_autocast_enabled(at::kCUDA, false); }
    } off;
    return sac::checkpoint(f, x);
  }();
  y.sum().backward();
  EXPECT_EQ(seen, (std::vector<bool>{true, true})) << "forward, then recomputation";

  auto meta = torch::randn({3}, torch::device(torch::kMeta).requires_grad(true));
  auto m = sac::checkpoint([](const at::Tensor& in) { return in.sin() * 2; }, meta);
  EXPECT_TRUE(m.is_meta());
  EXPECT_TRUE(torch::autograd::grad({m.sum()}, {meta})[0].is_meta());
}

// A region guard has no inputs to take devices from: it snapshots the
// generator of every device, and the replay restores each, not only the
// current device's. Two CPU generators stand in for two devices' here.
TEST_F(Checkpoint, ForwardStateRestoresEveryGeneratorItHolds) {
  auto first = at::make_generator<at::CPUGeneratorImpl>(1);
  auto second = at::make_generator<at::CPUGeneratorImpl>(2);
  auto draw = [](at::Generator g) { return at::randn({4}, g); };
  auto copy = [](at::Generator g) {
    std::lock_guard<std::mutex> lock(g.mutex());
    return g.clone();
  };
  auto state = sac::detail::ForwardState::capture_current(/*preserve_rng=*/true);
  state.add_generators({first, second});
  const auto forward_first = draw(first), forward_second = draw(second);
  draw(second);  // the other device's work after the forward
  const auto before_first = copy(first), before_second = copy(second);
  {
    sac::detail::ForwardState::Restore restore(state);
    EXPECT_TRUE(torch::equal(draw(first), forward_first));
    EXPECT_TRUE(torch::equal(draw(second), forward_second));
  }
  EXPECT_TRUE(torch::equal(draw(first), draw(before_first)));
  EXPECT_TRUE(torch::equal(draw(second), draw(before_second)));
}

TEST_F(Checkpoint, ExceptionInTheFunctionLeavesNoState) {
  auto plain_grad = [&] { return torch::autograd::grad({torch::tanh(x.mm(w)).sum()}, {w})[0]; };
  const auto before = plain_grad();
  EXPECT_THROW(sac::checkpoint(
                   sac::CheckpointOptions().policy(sac::Policy::save_ops({"aten::mm"})),
                   [&](const at::Tensor& in) -> at::Tensor {
                     auto h = in.mm(w);
                     TORCH_CHECK(false, "boom");
                     return h;
                   },
                   x),
               c10::Error);
  EXPECT_EQ(sac::detail::active_interceptor(), nullptr);
  // Saved-tensor hooks are gone: plain autograd saves and unpacks as usual.
  EXPECT_TRUE(torch::equal(plain_grad(), before));
}

TEST_F(Checkpoint, InputModifiedInPlaceBeforeBackwardIsAnError) {
  auto in = x.detach().clone();
  auto y = sac::checkpoint([&](const at::Tensor& t) { return t.mm(w).exp(); }, in);
  in.add_(1);
  const auto message = error_of([&] { torch::autograd::grad({y.sum()}, {w}); });
  EXPECT_NE(message.find("modified by an inplace operation"), std::string::npos) << message;
}

// Modes, hooks and frames live per thread: concurrent selective checkpoints
// on several threads each get their own, bit-identical, gradients.
TEST(CheckpointThreads, ConcurrentSelectiveCheckpointsAreIndependent) {
  sac_test::expect_configured_mechanism();
  torch::manual_seed(0);
  sac_test::Mlp mlp(32, 64, 16, 3);
  auto params = mlp->parameters();
  const auto policy = sac::Policy::save_ops({"aten::addmm"});
  // Kernels (per-op mechanism) are registered before the threads start.
  sac::create_selective_checkpoint_contexts(policy);
  constexpr int kThreads = 4, kIterations = 10;
  std::vector<at::Tensor> inputs, expected;
  for (int t = 0; t < kThreads; ++t) {
    inputs.push_back(torch::randn({8, 32}, torch::requires_grad()));
    auto wrt = params;
    wrt.push_back(inputs.back());
    for (auto& g : torch::autograd::grad({mlp->forward(inputs.back()).sum()}, wrt)) {
      expected.push_back(g);
    }
  }
  std::atomic<int> mismatches{0}, failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        auto wrt = params;
        wrt.push_back(inputs[t]);
        for (int i = 0; i < kIterations; ++i) {
          auto y = sac::checkpoint(
              sac::CheckpointOptions().policy(policy),
              [&](const at::Tensor& in) { return mlp->forward(in); }, inputs[t]);
          const auto grads = torch::autograd::grad({y.sum()}, wrt);
          for (size_t j = 0; j < grads.size(); ++j) {
            mismatches += !torch::equal(grads[j], expected[t * wrt.size() + j]);
          }
        }
      } catch (const std::exception&) {
        ++failures;
      }
    });
  }
  for (auto& thread : threads) {
    thread.join();
  }
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(mismatches.load(), 0);
}

// ---- Errors ---------------------------------------------------------------

// A custom function that reads its saved tensors twice in one backward.
struct ReadsSavedTwice : torch::autograd::Function<ReadsSavedTwice> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& t) {
    ctx->save_for_backward({t});
    return t * 2;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto first = ctx->get_saved_variables();
    auto second = ctx->get_saved_variables();
    return {grads[0] * 2 + 0 * first[0] * second[0]};
  }
};

TEST_F(Checkpoint, UnpackingTwiceIsAnError) {
  auto y =
      sac::checkpoint([&](const at::Tensor& in) { return ReadsSavedTwice::apply(in.mm(w)); }, x);
  const auto message =
      error_of<sac::CheckpointError>([&] { torch::autograd::grad({y.sum()}, {w}); });
  EXPECT_NE(message.find("unpacked a second time"), std::string::npos) << message;
  EXPECT_NE(message.find("once per backward"), std::string::npos) << message;
}

TEST_F(Checkpoint, SavingMoreTensorsInRecomputationIsAnError) {
  bool extra = false;
  auto f = [&](const at::Tensor& in) {
    auto h = in.mm(w);
    return extra ? torch::tanh(torch::sigmoid(h)) : torch::tanh(h);
  };
  sac::EarlyStopGuard no_early_stop(false);  // with early stop, extra saves are never reached
  auto y = sac::checkpoint(f, x);
  extra = true;
  const auto message =
      error_of<sac::CheckpointError>([&] { torch::autograd::grad({y.sum()}, {w}); });
  EXPECT_NE(message.find("more tensors during recomputation"), std::string::npos) << message;
  EXPECT_NE(message.find("debug(true)"), std::string::npos) << message;
}

TEST_F(Checkpoint, SavingFewerTensorsInRecomputationIsAnError) {
  bool fewer = false;
  auto f = [&](const at::Tensor& in) {
    auto h = in.mm(w);
    return fewer ? h * 2 : torch::tanh(torch::sigmoid(h));
  };
  auto y = sac::checkpoint(f, x);
  fewer = true;
  const auto message =
      error_of<sac::CheckpointError>([&] { torch::autograd::grad({y.sum()}, {w}); });
  EXPECT_NE(message.find("different number of tensors"), std::string::npos) << message;
}

TEST_F(Checkpoint, DeterminismCheckReportsMetadataMismatches) {
  bool as_double = false;
  auto f = [&](const at::Tensor& in) {
    auto h = as_double ? in.to(at::kDouble).mm(w.to(at::kDouble)).to(at::kFloat) : in.mm(w);
    return torch::tanh(h);
  };
  auto y = sac::checkpoint(f, x);
  as_double = true;
  const auto message =
      error_of<sac::CheckpointError>([&] { torch::autograd::grad({y.sum()}, {w}); });
  EXPECT_NE(message.find("different metadata"), std::string::npos) << message;
  EXPECT_NE(message.find("dtype: Double"), std::string::npos) << message;
  EXPECT_NE(message.find("DeterminismCheck::None"), std::string::npos) << message;
}

// A recomputed tensor of another shape that autograd does not mind (a
// broadcast mask): the default check refuses it, DeterminismCheck::None lets
// it through with the same gradients.
TEST_F(Checkpoint, DeterminismCheckCanBeTurnedOff) {
  bool broadcast = false;
  auto f = [&](const at::Tensor& in) {
    auto mask = broadcast ? torch::ones({1, 16}) : torch::ones({4, 16});
    return torch::tanh(in.mm(w)) * mask;
  };
  const auto expected = run_and_grad([&] { return f(x); }, {x}, {w});
  auto recompute_with_broadcast = [&](const sac::CheckpointOptions& options) {
    broadcast = false;
    return run_and_grad(
        [&] {
          auto y = sac::checkpoint(options, f, x);
          broadcast = true;
          return y;
        },
        {x}, {w});
  };
  const auto message =
      error_of<sac::CheckpointError>([&] { recompute_with_broadcast(sac::CheckpointOptions()); });
  EXPECT_NE(message.find("shape: [1, 16]"), std::string::npos) << message;
  expect_bit_identical(expected,
                       recompute_with_broadcast(sac::CheckpointOptions().determinism_check(
                           sac::DeterminismCheck::None)));
}

TEST_F(Checkpoint, DebugModePrintsTheOpsOfBothPasses) {
  bool fewer = false;
  auto f = [&](const at::Tensor& in) {
    auto h = in.mm(w);
    return fewer ? h * 2 : torch::tanh(torch::sigmoid(h));
  };
  auto y = sac::checkpoint(sac::CheckpointOptions().debug(true), f, x);
  fewer = true;
  const auto message =
      error_of<sac::CheckpointError>([&] { torch::autograd::grad({y.sum()}, {w}); });
  EXPECT_NE(message.find("different number of tensors"), std::string::npos) << message;
  EXPECT_NE(message.find("Ops executed during the original forward"), std::string::npos) << message;
  EXPECT_NE(message.find("aten::sigmoid"), std::string::npos) << message;
  EXPECT_NE(message.find("Ops executed during recomputation"), std::string::npos) << message;
  EXPECT_NE(message.find("aten::mul"), std::string::npos) << message;
}

// A selective region whose recomputation runs an op more often than its
// forward: the cache's error is a CheckpointError (every error raised while
// recomputing is one), and the debug option attaches both op logs to it.
TEST_F(Checkpoint, DebugModeWithAPolicyPrintsTheOpsOfBothPasses) {
  bool more = false;
  auto f = [&](const at::Tensor& in) {
    const auto h = in.mm(w);
    const auto twice = h + h;  // add saves nothing: the cache sees the extra call
    return torch::tanh(more ? twice + twice : twice);
  };
  const auto policy = sac::Policy::save_ops({"aten::add.Tensor"});
  for (const bool debug : {false, true}) {
    SCOPED_TRACE(debug ? "debug" : "no debug");
    more = false;
    auto y = sac::checkpoint(sac::CheckpointOptions().policy(policy).debug(debug), f, x);
    more = true;
    const auto message =
        error_of<sac::CheckpointError>([&] { torch::autograd::grad({y.sum()}, {w}); });
    EXPECT_NE(message.find("aten::add.Tensor ran at least 2 times during recomputation"),
              std::string::npos)
        << message;
    EXPECT_EQ(message.find("Ops executed during the original forward") != std::string::npos, debug)
        << message;
    EXPECT_EQ(message.find("Ops executed during recomputation") != std::string::npos, debug)
        << message;
  }
}

TEST_F(Checkpoint, DebugGuardTurnsDebugOnWithBacktraces) {
  bool fewer = false;
  auto f = [&](const at::Tensor& in) {
    auto h = in.mm(w);
    return fewer ? h * 2 : torch::tanh(torch::sigmoid(h));
  };
  at::Tensor y;
  {
    sac::DebugGuard debug(true);
    y = sac::checkpoint(sac::CheckpointOptions().debug_backtraces(true), f, x);
  }
  fewer = true;
  const auto message =
      error_of<sac::CheckpointError>([&] { torch::autograd::grad({y.sum()}, {w}); });
  EXPECT_NE(message.find("Backtraces of the ops of the original forward"), std::string::npos)
      << message;
}

// Logs belong to their frame: repeated iterations keep the same size and
// free everything.
TEST_F(Checkpoint, DebugModeNeitherLeaksNorGrows) {
  auto f = [&](const at::Tensor& in) { return torch::tanh(in.mm(w)).mm(w); };
  std::optional<size_t> per_iteration;
  for (int i = 0; i < 20; ++i) {
    auto y = sac::checkpoint(sac::CheckpointOptions().debug(true), f, x);
    const size_t live = sac::detail::OpLog::live_entries();
    EXPECT_GT(live, 0u);
    if (!per_iteration) per_iteration = live;
    EXPECT_EQ(live, *per_iteration) << "iteration " << i;
    torch::autograd::grad({y.sum()}, {w});
    y.reset();
    EXPECT_EQ(sac::detail::OpLog::live_entries(), 0u) << "iteration " << i;
  }
}

TEST_F(Checkpoint, PolicyAndContextFnTogetherIsAnError) {
  const auto message = error_of([&] {
    sac::checkpoint(
        sac::CheckpointOptions().policy(sac::Policy::save_ops({"aten::mm"})).context_fn([] {
          return sac::RegionContexts{};
        }),
        [&](const at::Tensor& in) { return in.mm(w); }, x);
  });
  EXPECT_NE(message.find("both a policy and a context_fn"), std::string::npos) << message;
}

TEST_F(Checkpoint, ReusingOnePairOfModesForTwoRegionsIsAnError) {
  auto modes = sac::create_selective_checkpoint_contexts(sac::Policy::save_ops({"aten::mm"}));
  auto options =
      sac::CheckpointOptions().context_fn([modes] { return sac::RegionContexts(modes); });
  auto f = [&](const at::Tensor& in) { return torch::tanh(in.mm(w)); };
  auto first = sac::checkpoint(options, f, x);
  const auto message = error_of([&] { sac::checkpoint(options, f, x); });
  EXPECT_NE(message.find("already filled its cache"), std::string::npos) << message;
  EXPECT_NE(message.find("create_selective_checkpoint_contexts each time"), std::string::npos)
      << message;
  // Once the first region's graph is gone, the pair is free again.
  torch::autograd::grad({first.sum()}, {w});
  first.reset();
  EXPECT_NO_THROW(sac::checkpoint(options, f, x));
}

TEST_F(Checkpoint, SelectiveOptionsWithoutPolicyAreAnError) {
  const auto message = error_of([&] {
    sac::checkpoint(
        sac::CheckpointOptions().allow_cache_entry_mutation(true),
        [&](const at::Tensor& in) { return in.mm(w); }, x);
  });
  EXPECT_NE(message.find("no policy was given"), std::string::npos) << message;
  EXPECT_NE(message.find("Add .policy"), std::string::npos) << message;
}

}  // namespace checkpoint_test
