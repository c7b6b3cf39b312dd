// Regressions: each test is a complete program that once gave wrong
// gradients, crashed, or failed in ordinary use (issue 5), run under both
// dispatch mechanisms by ctest. Each says what it once did.
#include "support.h"

#include <sac/base/internal/saved_tensor_hooks.h>
#include <sac/dispatch/internal/interceptor.h>

#include <thread>

namespace regressions_test {

using sac_test::error_of;
using sac_test::expect_bit_identical;
using sac_test::run_and_grad;

class Regressions : public ::testing::Test {
 protected:
  void SetUp() override { sac_test::expect_configured_mechanism(); }
};

sac::CheckpointOptions saving(const std::vector<std::string>& ops) {
  return sac::CheckpointOptions().policy(sac::Policy::save_ops(ops));
}

sac::Policy save_everything() {
  return sac::Policy::from_fn([](const sac::SelectiveCheckpointContext&, const c10::OperatorHandle&,
                                 c10::ArrayRef<c10::IValue>) { return true; });
}

// 1. LibTorch's Linear on 3-D input runs mm, _unsafe_view, then adds its bias
// in place. With both mm and _unsafe_view saved, the in-place add reached the
// cached mm output without demoting it under per-op kernels, and the
// recomputation added the bias twice (weight gradient off by up to 4.7).
TEST_F(Regressions, Linear3dSavingMmAndUnsafeViewDoesNotAddTheBiasTwice) {
  torch::manual_seed(0);
  torch::nn::Linear lin(4, 5);
  auto x = torch::randn({3, 2, 4}, torch::requires_grad());
  auto f = [&](const at::Tensor& a) { return lin->forward(a.transpose(0, 1)).exp(); };
  const std::vector<at::Tensor> params{lin->weight, lin->bias};
  const auto expected = run_and_grad([&] { return f(x); }, {x}, params);
  const auto actual = run_and_grad(
      [&] {
        return sac::checkpoint(saving({"aten::mm", "aten::_unsafe_view"}), f, x);
      },
      {x}, params);
  expect_bit_identical(expected, actual);
}

TEST_F(Regressions, Linear3dUnderSaveEverythingCallback) {
  torch::manual_seed(0);
  torch::nn::Linear qkv(8, 24);
  auto x = torch::randn({2, 5, 8}, torch::requires_grad());
  auto f = [&](const at::Tensor& a) {
    auto h = qkv(a);
    return h * h;
  };
  const std::vector<at::Tensor> params{qkv->weight, qkv->bias};
  const auto expected = run_and_grad([&] { return f(x); }, {x}, params);
  const auto actual = run_and_grad(
      [&] { return sac::checkpoint(sac::CheckpointOptions().policy(save_everything()), f, x); },
      {x}, params);
  expect_bit_identical(expected, actual);
}

// 2. A nested checkpoint whose function modifies its argument in place. The
// outer region's holders carried no version check, so the inner region was
// recomputed from the modified argument (wrong gradient, as in PyTorch 2.13).
// Now it is the error of a modified argument, as at top level.
TEST_F(Regressions, NestedRegionModifyingItsArgumentIsAutogradsError) {
  torch::manual_seed(0);
  auto w = torch::randn({4, 4}, torch::requires_grad());
  auto x = torch::randn({4, 4}, torch::requires_grad());
  auto inner = [&](const at::Tensor& a) {
    a.add_(1);
    return a * w;
  };
  auto outer = [&](const at::Tensor& in) { return sac::checkpoint(inner, in * 2).sin(); };
  for (const bool selective : {false, true}) {
    SCOPED_TRACE(selective ? "selective" : "full recompute");
    auto options = selective ? saving({"aten::mul.Tensor"}) : sac::CheckpointOptions();
    const std::string message = error_of([&] {
      auto y = sac::checkpoint(options, outer, x);
      torch::autograd::grad({y.sum()}, {w});
    });
    EXPECT_NE(message.find("modified by an inplace operation"), std::string::npos) << message;
    EXPECT_NE(message.find("tensor argument 0 of the checkpointed function"), std::string::npos)
        << message;
    EXPECT_NE(message.find("the checkpointed function modifying its own argument counts too"),
              std::string::npos)
        << message;
  }
  // At top level the same function gets the same kind of error.
  const std::string top = error_of([&] {
    auto y = sac::checkpoint(inner, x * 2).sin();
    torch::autograd::grad({y.sum()}, {w});
  });
  EXPECT_NE(top.find("modified by an inplace operation"), std::string::npos) << top;
  EXPECT_NE(top.find("sac::checkpoint keeps its tensor arguments"), std::string::npos) << top;
}

// The holders' version check must not fire where autograd's would not: a
// nested region whose argument is modified in place *before* it is saved.
TEST_F(Regressions, NestedRegionOnAFreshlyModifiedTensorIsExact) {
  torch::manual_seed(0);
  auto w = torch::randn({4, 4}, torch::requires_grad());
  auto x = torch::randn({4, 4}, torch::requires_grad());
  auto inner = [&](const at::Tensor& a) { return (a * w).tanh(); };
  auto outer = [&](const at::Tensor& in) {
    auto h = in * 2;
    h.add_(1);
    return sac::checkpoint(inner, h).sin();
  };
  const auto expected = run_and_grad([&] { return outer(x); }, {x}, {w});
  const auto actual = run_and_grad([&] { return sac::checkpoint(outer, x); }, {x}, {w});
  expect_bit_identical(expected, actual);
}

// 3. A tensor the region reads but did not make (a buffer), modified in place
// after the read: the recomputation read the modified buffer (wrong
// gradient, as in PyTorch). Now a clear error, in the region and between
// forward and backward, under every policy.
TEST_F(Regressions, OutsideTensorModifiedAfterTheReadIsAnError) {
  torch::manual_seed(0);
  auto a = torch::randn({3, 3}, torch::requires_grad());
  for (const bool selective : {false, true}) {
    SCOPED_TRACE(selective ? "selective" : "full recompute");
    auto options = selective ? saving({"aten::mm"}) : sac::CheckpointOptions();
    auto buf = torch::randn({3, 3});
    auto inside = [&](const at::Tensor& in) {
      auto y = (in + buf).sin();
      buf.mul_(0.5);
      return y;
    };
    std::string message = error_of<sac::CheckpointError>([&] {
      auto y = sac::checkpoint(options, inside, a);
      torch::autograd::grad({y.sum()}, {a});
    });
    EXPECT_NE(message.find("was modified in place after the forward read it"), std::string::npos)
        << message;
    EXPECT_NE(message.find("aten::add"), std::string::npos) << message;

    auto between = [&](const at::Tensor& in) { return (in + buf).sin(); };
    message = error_of<sac::CheckpointError>([&] {
      auto y = sac::checkpoint(options, between, a);
      buf.mul_(0.5);
      torch::autograd::grad({y.sum()}, {a});
    });
    EXPECT_NE(message.find("was modified in place after the forward read it"), std::string::npos)
        << message;
  }
}

// The same read by an in-place op (h.add_(buf)), which no per-op kernel
// intercepts: under both mechanisms an error, not a wrong gradient. Without
// the check, the gradient is wrong: what the check is for.
TEST_F(Regressions, OutsideTensorReadByAnInPlaceOpModifiedLaterIsAnError) {
  torch::manual_seed(0);
  auto a = torch::randn({3, 3}, torch::requires_grad());
  auto buf = torch::randn({3, 3});
  auto inside = [&](const at::Tensor& in) {
    auto h = in * in;
    h.add_(buf);
    return h.sin();
  };
  const auto expected = run_and_grad([&] { return inside(a); }, {a}, {});
  for (const bool selective : {false, true}) {
    SCOPED_TRACE(selective ? "selective" : "full recompute");
    auto options = selective ? saving({"aten::sin"}) : sac::CheckpointOptions();
    const at::Tensor kept = buf.clone();
    auto y =
        sac::checkpoint(sac::CheckpointOptions(options).outside_tensor_check(false), inside, a);
    buf.mul_(0.5);
    const auto unchecked = torch::autograd::grad({y.sum()}, {a});
    EXPECT_FALSE(unchecked[0].equal(expected[0])) << "the unchecked gradient should be wrong";
    buf.copy_(kept);
    const std::string message = error_of<sac::CheckpointError>([&] {
      auto y = sac::checkpoint(options, inside, a);
      buf.mul_(0.5);
      torch::autograd::grad({y.sum()}, {a});
    });
    EXPECT_NE(message.find("was modified in place after the forward read it"), std::string::npos)
        << message;
    EXPECT_NE(message.find("argument 'other' of aten::add_.Tensor"), std::string::npos) << message;
    buf.copy_(kept);
  }
}

// What the watch must not flag: a buffer only written by the region (running
// statistics), a buffer modified before the region, the region's own
// intermediates modified in place, and a BatchNorm module (its running
// statistics are written by the op that reads the batch).
TEST_F(Regressions, OutsideTensorsThatDoNotChangeTheResultAreAccepted) {
  torch::manual_seed(0);
  auto a = torch::randn({4, 3}, torch::requires_grad());
  auto counter = torch::zeros({1});
  auto buf = torch::randn({4, 3});
  buf.mul_(2);  // before the region: fine
  auto f = [&](const at::Tensor& in) {
    counter.add_(1);  // written, never read
    auto h = in * buf;
    h.add_(1);  // the region's own tensor
    return h.exp();
  };
  const auto expected = run_and_grad([&] { return f(a); }, {a}, {});
  const auto actual = run_and_grad([&] { return sac::checkpoint(f, a); }, {a}, {});
  expect_bit_identical(expected, actual);

  torch::nn::BatchNorm1d bn(3);
  auto g = [&](const at::Tensor& in) { return bn(in).tanh(); };
  const auto bn_expected = run_and_grad([&] { return g(a); }, {a}, {bn->weight, bn->bias});
  const auto bn_actual =
      run_and_grad([&] { return sac::checkpoint(saving({"aten::native_batch_norm"}), g, a); }, {a},
                   {bn->weight, bn->bias});
  expect_bit_identical(bn_expected, bn_actual);
}

// Issue 44: a tensor from before the region (a scratch buffer, FSDP's
// unsharded parameter, a cache) written whole inside it, and only then read.
// The recomputation writes it again before it reads it, and so reads what
// the forward read: exact, as without checkpointing (Note [Overwritten
// before read]), where the check raised that it "was modified in place
// after the forward read it". Written in part, or read first, it is still
// checked (the tests above).
TEST_F(Regressions, OutsideBufferOverwrittenWholeBeforeItIsReadIsExact) {
  torch::manual_seed(0);
  auto a = torch::randn({3, 4}, torch::requires_grad());
  auto w = torch::randn({4}, torch::requires_grad());
  // A new buffer for each step: a buffer written with grad keeps the last
  // step's graph in its history.
  at::Tensor buf;
  auto f = [&](const at::Tensor& in) {
    buf.copy_(in.sin());
    return (buf.mean(1, /*keepdim=*/true) * in * w).tanh();
  };
  auto step = [&](const std::function<at::Tensor()>& forward) {
    buf = torch::zeros({3, 4});
    return run_and_grad(forward, {a}, {w});
  };
  const auto expected = step([&] { return f(a); });
  for (const bool selective : {false, true}) {
    SCOPED_TRACE(selective ? "selective" : "full recompute");
    auto options = selective ? saving({"aten::mul.Tensor"}) : sac::CheckpointOptions();
    expect_bit_identical(expected, step([&] { return sac::checkpoint(options, f, a); }));
  }
  // Written whole by an out= op (no grad), and read by an in-place op.
  auto g = [&](const at::Tensor& in) {
    at::mul_out(buf, in.detach(), 3.0);
    auto h = in.sin();
    h.add_(buf);
    return h * w;
  };
  SCOPED_TRACE("out=");
  expect_bit_identical(step([&] { return g(a); }), step([&] { return sac::checkpoint(g, a); }));
}

// The same buffer written with grad and read by an op that saves it,
// backwarded twice (retain_graph, which full recomputation allows): each
// recomputation writes it again, and the second backward found it at the
// first recomputation's version ("a tensor saved inside a checkpointed
// region is at version 2; expected version 1").
TEST_F(Regressions, OutsideBufferOverwrittenWholeBackwardTwiceIsExact) {
  torch::manual_seed(0);
  auto a = torch::randn({3, 4}, torch::requires_grad());
  auto w = torch::randn({4}, torch::requires_grad());
  at::Tensor buf;
  auto f = [&](const at::Tensor& in) {
    buf.copy_(in * 2);
    return (buf * w).sin().sum();
  };
  auto twice = [&](const std::function<at::Tensor()>& forward) {
    buf = torch::zeros({3, 4});
    const at::Tensor y = forward();
    auto first = torch::autograd::grad({y}, {a, w}, {}, /*retain_graph=*/true);
    auto second = torch::autograd::grad({y}, {a, w});
    first.insert(first.end(), second.begin(), second.end());
    return first;
  };
  const auto expected = twice([&] { return f(a); });
  const auto actual = twice([&] { return sac::checkpoint(f, a); });
  expect_bit_identical(expected, actual);
}

// A buffer one region overwrites whole and another reads, nested inside it
// or after it: the first region's recomputation writes it again (the same
// values, a new version) before the second recomputes, and the second's
// checks of versions raised "modified in place after the forward read it"
// (found by the fuzzer). The second watches the buffer's bytes (Note
// [Rewritten by a recomputation]): exact, as without checkpointing.
TEST_F(Regressions, OutsideBufferOverwrittenByAnotherRegionIsExact) {
  torch::manual_seed(0);
  auto a = torch::randn({3, 4}, torch::requires_grad());
  auto w = torch::randn({4}, torch::requires_grad());
  at::Tensor buf;
  auto overwrite = [&](const at::Tensor& in) {
    buf.copy_(in.sin());
    return in * buf.mean();
  };
  auto read = [&](const at::Tensor& in) { return (in * buf * w).tanh(); };
  // Inside: the inner region's argument is held by the outer region, so
  // unpacking it recomputes the outer region first.
  auto nested = [&](const at::Tensor& in) {
    auto h = overwrite(in);
    return h + sac::checkpoint(read, in * 2);
  };
  auto step = [&](const std::function<at::Tensor()>& forward) {
    buf = torch::zeros({3, 4});
    return run_and_grad(forward, {a}, {w});
  };
  {
    SCOPED_TRACE("nested");
    expect_bit_identical(step([&] { return nested(a); }),
                         step([&] { return sac::checkpoint(nested, a); }));
  }
  // After it: two backward passes, the overwriting region's first.
  auto one_then_other = [&](bool checkpointed) {
    buf = torch::zeros({3, 4});
    auto run = [&](auto& f) { return checkpointed ? sac::checkpoint(f, a) : f(a); };
    const at::Tensor first = run(overwrite);
    const at::Tensor second = run(read);
    // Kept: the second region reads the buffer's history, made in the first.
    auto grads = torch::autograd::grad({first.sum()}, {a}, {}, /*retain_graph=*/true);
    const auto more = torch::autograd::grad({second.sum()}, {a, w});
    grads.insert(grads.end(), more.begin(), more.end());
    return grads;
  };
  SCOPED_TRACE("after it");
  expect_bit_identical(one_then_other(false), one_then_other(true));
}

// What stays caught: a buffer the first region overwrote, written again
// (other values) before the second region reads it. The first region's
// recomputation restores what it wrote, and the second would read that, not
// what its forward read. (A buffer the second region saves is caught by
// autograd's own check, which sac's holders keep.)
TEST_F(Regressions, OutsideBufferRewrittenBetweenTwoRegionsIsCaught) {
  torch::manual_seed(0);
  auto a = torch::randn({3, 4}, torch::requires_grad());
  at::Tensor buf;
  auto overwrite = [&](const at::Tensor& in) {
    buf.copy_(in.sin());
    return in * buf.mean();
  };
  auto read = [&](const at::Tensor& in) { return (in + buf).tanh(); };  // buf not saved
  auto second_grad = [&](const sac::CheckpointOptions* options) {
    buf = torch::zeros({3, 4});
    const at::Tensor first = options ? sac::checkpoint(overwrite, a) : overwrite(a);
    buf.mul_(2);
    const at::Tensor second = options ? sac::checkpoint(*options, read, a) : read(a);
    torch::autograd::grad({first.sum()}, {a}, {}, /*retain_graph=*/true);
    return torch::autograd::grad({second.sum()}, {a})[0];
  };
  const at::Tensor expected = second_grad(nullptr);
  const auto unchecked = sac::CheckpointOptions().outside_tensor_check(false);
  EXPECT_FALSE(second_grad(&unchecked).equal(expected)) << "the unchecked gradient should be wrong";
  const auto checked = sac::CheckpointOptions();
  const std::string message = error_of<sac::CheckpointError>([&] { second_grad(&checked); });
  EXPECT_NE(message.find("was modified in place after the forward read it"), std::string::npos)
      << message;
}

// A view whose base was modified in place after it was taken, given to a
// checkpoint under hooks (an enclosing checkpoint's, an offload guard's):
// saving it made its grad_fn then, not where the function first uses it, so
// that node came before the function's first node in backward's order, and
// backward summed the base's gradient in another order (bits apart; found by
// the fuzzer). Note [Saving a stale view].
TEST_F(Regressions, AViewModifiedThroughItsBaseKeepsItsPlaceInBackward) {
  torch::manual_seed(0);
  auto a = torch::randn({32, 48}, torch::requires_grad());
  // The sequence numbers of the function's first node and of the view's
  // node, as the forward made them.
  std::optional<std::pair<uint64_t, uint64_t>> order;
  auto inner = [&](const at::Tensor& b, const at::Tensor& v) {
    const at::Tensor first = b.sin();
    const at::Tensor h = first * 3 + v.exp().view({32, 48});
    if (!order) {  // the forward, not the recomputation
      order.emplace(first.grad_fn()->sequence_nr(), v.grad_fn()->sequence_nr());
    }
    return h;
  };
  auto step = [&](const at::Tensor& x, bool checkpointed) {
    auto base = x * 1.5;
    auto v = base.view({48, 32});
    base.tanh_();
    EXPECT_TRUE(sac::detail::grad_fn_is_stale(v));
    const at::Tensor h = checkpointed ? sac::checkpoint(inner, base, v) : inner(base, v);
    return ((h * base.cos()).sum() + base.square().sum()) * 7;
  };
  auto expect_order = [&](const char* what) {
    ASSERT_TRUE(order.has_value());
    EXPECT_LT(order->first, order->second) << what << ": the view's node was made first";
    order.reset();
  };
  const auto expected = run_and_grad([&] { return step(a, false); }, {a}, {});
  expect_order("plain");
  expect_bit_identical(
      expected,
      run_and_grad(
          [&] { return sac::checkpoint([&](const at::Tensor& x) { return step(x, true); }, a); },
          {a}, {}));
  expect_order("nested");
  expect_bit_identical(expected, run_and_grad(
                                     [&] {
                                       const sac::OffloadGuard offload;
                                       return step(a, true);
                                     },
                                     {a}, {}));
  expect_order("under an offload guard");
}

// x.sin() * x through a custom Function whose backward differentiates its
// own graph with torch::autograd::grad: a backward inside a backward.
struct ReentrantSinTimes : torch::autograd::Function<ReentrantSinTimes> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a) {
    const at::AutoGradMode grad(true);
    const at::Tensor detached = a.detach().requires_grad_();
    const at::Tensor y = detached.sin() * detached;
    ctx->saved_data["y"] = y;
    ctx->saved_data["a"] = detached;
    return y.detach();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {torch::autograd::grad({ctx->saved_data["y"].toTensor()},
                                  {ctx->saved_data["a"].toTensor()}, {grads[0]},
                                  /*retain_graph=*/true)[0]};
  }
};

// A backward inside a selective region's forward (an inner grad that runs
// through a custom Function whose backward calls torch::autograd::grad)
// sums a gradient out of place in the forward, where the cache holds the output it sums into, and
// in place in the recomputation, where the cache had handed it out: an aten::add_ where the forward
// ran aten::add, so the region's next add was served the forward's other add. Gradients 10^6 off,
// no error (found by the fuzzer). Note [Served inside a backward].
TEST_F(Regressions, ABackwardInsideTheRegionSumsAsInItsForward) {
  torch::manual_seed(0);
  auto x = torch::randn({6, 5, 3}, torch::requires_grad());
  const auto buf = torch::randn({6, 5, 3});
  auto inner_grad = [](const at::Tensor& a, const at::Tensor& b) {
    return torch::autograd::grad({(a.sin() * b).sum()}, {a}, {}, std::nullopt,
                                 /*create_graph=*/true)[0];
  };
  auto region = [&](const at::Tensor& v, const at::Tensor& x) {
    const at::Tensor h = buf.sin() * v;
    const at::Tensor g = inner_grad(x, h);  // through ReentrantSinTimes's backward
    const at::Tensor gg = inner_grad(g, v);
    return std::vector<at::Tensor>{h.tanh(), h * gg, gg.sigmoid()};
  };
  auto step = [&](bool checkpointed) {
    const at::Tensor v = ReentrantSinTimes::apply(x).pow(2);
    const auto outs =
        checkpointed ? sac::checkpoint(sac::CheckpointOptions().policy(sac::everything_saveable()),
                                       region, v, x)
                     : region(v, x);
    return outs[0].sum() + outs[1].sum() * 2 + outs[2].sum() * 3;
  };
  expect_bit_identical(run_and_grad([&] { return step(false); }, {x}, {}),
                       run_and_grad([&] { return step(true); }, {x}, {}));
}

TEST_F(Regressions, OutsideTensorCheckCanBeTurnedOff) {
  torch::manual_seed(0);
  auto a = torch::randn({3, 3}, torch::requires_grad());
  auto buf = torch::randn({3, 3});
  auto f = [&](const at::Tensor& in) { return (in + buf).sin(); };  // buf not saved
  const auto expected = torch::autograd::grad({f(a).sum()}, {a})[0];
  auto y = sac::checkpoint(sac::CheckpointOptions().outside_tensor_check(false), f, a);
  buf.mul_(1.0);  // a new version, the same values: the user knows better
  at::Tensor g;
  EXPECT_NO_THROW(g = torch::autograd::grad({y.sum()}, {a})[0]);
  EXPECT_TRUE(torch::equal(g, expected));
}

// 4. Full recompute with torch::autograd::grad(create_graph) inside the
// function: early stop threw a non-std::exception out of a pack hook through
// the autograd engine, which leaked its reentrant depth each time: correct
// for ~60 iterations, then SIGSEGV in Engine::add_thread_pool_task.
TEST_F(Regressions, GradWithCreateGraphInsideTheRegionOverManyIterations) {
  torch::manual_seed(0);
  auto x = torch::randn({5}, torch::requires_grad());
  auto f = [](const at::Tensor& a) {
    return torch::autograd::grad({a.exp().sum()}, {a}, {}, true, /*create_graph=*/true)[0];
  };
  const auto expected = torch::autograd::grad({f(x).pow(2).sum()}, {x})[0];
  for (const bool early_stop : {true, false}) {
    for (int i = 0; i < 200; ++i) {
      auto y = sac::checkpoint(sac::CheckpointOptions().early_stop(early_stop), f, x);
      const auto g = torch::autograd::grad({y.pow(2).sum()}, {x})[0];
      ASSERT_TRUE(torch::equal(g, expected)) << "iteration " << i;
    }
  }
}

// User code inside the function that catches std::exception does not stop
// early stop: it is thrown again at the next saved tensor.
TEST_F(Regressions, EarlyStopSurvivesUserCodeCatchingStdException) {
  torch::manual_seed(0);
  auto x = torch::randn({4}, torch::requires_grad());
  int swallowed = 0;
  auto f = [&](const at::Tensor& a) {
    at::Tensor h;
    try {
      // In recomputation the last holder is filled by cos: early stop throws.
      h = (a.sin().exp() * 3).tanh() + a.cos();
    } catch (const std::exception&) {
      ++swallowed;
      h = a.sin();  // saves a tensor: early stop throws again, past the catch
    }
    return h;
  };
  const auto expected = run_and_grad([&] { return f(x); }, {x}, {});
  const auto actual = run_and_grad([&] { return sac::checkpoint(f, x); }, {x}, {});
  expect_bit_identical(expected, actual);
  EXPECT_EQ(swallowed, 1);
}

// Issue 44: the same catch block running an op the forward never ran, under
// a callback policy: the op cache raised "aten::add.Scalar ran during
// recomputation but never in the checkpointed forward" though forward and
// recomputation agree up to the stop. The stop is sticky (Note [Early stop
// cannot be swallowed]): the catch block's first op throws it again.
TEST_F(Regressions, EarlyStopIsNotSwallowedByACatchThatRunsNewOps) {
  torch::manual_seed(0);
  auto x = torch::randn({4}, torch::requires_grad());
  int swallowed = 0;
  auto f = [&](const at::Tensor& a) {
    at::Tensor h;
    try {
      h = (a.sin().exp() * 3).tanh() + a.cos();
    } catch (const std::exception&) {
      ++swallowed;
      h = a.add(1.0).sin();  // never run in the forward
    }
    return h;
  };
  const auto expected = run_and_grad([&] { return f(x); }, {x}, {});
  for (const bool callback : {true, false}) {
    SCOPED_TRACE(callback ? "callback policy" : "op list");
    swallowed = 0;
    auto options = sac::CheckpointOptions().policy(callback ? save_everything()
                                                            : sac::Policy::save_ops({"aten::exp"}));
    const auto actual = run_and_grad([&] { return sac::checkpoint(options, f, x); }, {x}, {});
    expect_bit_identical(expected, actual);
    EXPECT_EQ(swallowed, 1);
  }
}

// Issue 44: sac's own error in a recomputation (here: a selective region
// backwarded a second time) caught by the same catch block, which then ran
// ops the forward never ran: the user saw the error that followed ("never in
// the checkpointed forward"), not sac's. The first error is sticky too.
TEST_F(Regressions, AnErrorOfTheRecomputationIsNotSwallowedByACatch) {
  torch::manual_seed(0);
  auto x = torch::randn({4}, torch::requires_grad());
  int swallowed = 0;
  auto f = [&](const at::Tensor& a) {
    at::Tensor h;
    try {
      h = (a.sin().exp() * 3).tanh();
    } catch (const std::exception&) {
      ++swallowed;
      h = a.add(1.0).sin();
    }
    return h;
  };
  const auto y = sac::checkpoint(sac::CheckpointOptions().policy(save_everything()), f, x).sum();
  torch::autograd::grad({y}, {x}, {}, /*retain_graph=*/true);
  const std::string message =
      error_of<sac::CheckpointError>([&] { torch::autograd::grad({y}, {x}); });
  EXPECT_NE(message.find("backward an extra time"), std::string::npos) << message;
  EXPECT_EQ(swallowed, 2);  // the first backward's early stop, the second's error
}

// Issue 44: an in-place op that saves its own output (relu_, sigmoid_, exp_,
// tanh_) on a select or narrow view in the region, then a double backward:
// autograd unpacks that output twice in the second backward (Note [A view
// saved by an in-place op is unpacked twice]), and sac raised "a saved tensor
// is being unpacked a second time in the same backward pass" (PyTorch's
// checkpoint raises the same). Exact, in sac::checkpoint and in the region.
TEST_F(Regressions, DoubleBackwardAfterAnInPlaceOpOnAViewIsExact) {
  torch::manual_seed(0);
  auto x = torch::randn({3, 4}, torch::requires_grad());
  using InPlace = std::function<void(at::Tensor)>;
  const std::vector<std::pair<std::string, InPlace>> ops = {
      {"relu_", [](at::Tensor v) { v.relu_(); }},
      {"sigmoid_", [](at::Tensor v) { v.sigmoid_(); }},
      {"exp_", [](at::Tensor v) { v.exp_(); }},
      {"tanh_", [](at::Tensor v) { v.tanh_(); }}};
  for (const auto& [name, op] : ops) {
    for (const bool narrow : {false, true}) {
      SCOPED_TRACE(name + (narrow ? " on narrow" : " on select"));
      auto f = [&, op = op, narrow = narrow](const at::Tensor& a) {
        auto h = a * 2;
        op(narrow ? h.narrow(1, 1, 2) : h.select(0, 1));
        return h.sin();
      };
      auto second = [&](const std::function<at::Tensor(const at::Tensor&)>& forward) {
        const auto g = torch::autograd::grad({forward(x).sum()}, {x}, {}, true, true)[0];
        return torch::autograd::grad({(g * g).sum()}, {x});
      };
      const auto expected = second(f);
      expect_bit_identical(expected,
                           second([&](const at::Tensor& a) { return sac::checkpoint(f, a); }));
      if (sac::detail::observers_see_every_op()) {  // the region guard needs the fallback key
        expect_bit_identical(expected, second([&](const at::Tensor& a) {
                               sac::CheckpointRegion region;
                               return f(a);
                             }));
      }
    }
  }
}

// 5. is in dispatch_late_registration_test.cpp: it needs a process of its own.

// 6. A saved output modified in place in the forward is demoted to
// recompute (with RecomputeDecisions::AskPolicy, since removed, the
// recomputation then blamed the policy).
TEST_F(Regressions, ADemotedCallIsRecomputedWithTheModification) {
  torch::manual_seed(0);
  auto a = torch::randn({4, 4}, torch::requires_grad());
  auto b = torch::randn({4, 4}, torch::requires_grad());
  auto f = [](const at::Tensor& p, const at::Tensor& q) {
    auto y = p.mm(q);
    y.mul_(2);
    return y.sin();
  };
  const auto expected = run_and_grad([&] { return f(a, b); }, {a, b}, {});
  const auto actual =
      run_and_grad([&] { return sac::checkpoint(saving({"aten::mm"}), f, a, b); }, {a, b}, {});
  expect_bit_identical(expected, actual);
}

// Errors a user meets through no fault of sac say what they mean for a
// checkpointed region.
TEST_F(Regressions, RetainGraphThroughASelectiveRegionSaysWhatToDo) {
  torch::manual_seed(0);
  auto x = torch::randn({4, 4}, torch::requires_grad());
  auto y = sac::checkpoint(
      saving({"aten::mm"}), [](const at::Tensor& a) { return a.mm(a).tanh(); }, x);
  torch::autograd::grad({y.sum()}, {x}, {}, /*retain_graph=*/true);
  const std::string message = error_of([&] { torch::autograd::grad({y.sum()}, {x}); });
  EXPECT_NE(message.find("backward an extra time"), std::string::npos) << message;
  EXPECT_NE(message.find("without a policy"), std::string::npos) << message;
}

// Found by the fuzzer (seeds 13545540041466774281, 15537403130574667707 and
// six more): torch::autograd::grad inside a selective region. The inner
// backward unpacks the region's own holders, so the region is recomputed
// while its forward is still recording: without early stop that
// recomputation ran past the record ("aten::mul.Tensor ran at least 2 times
// during recomputation but only 1 times in the checkpointed forward"), and
// with it, it consumed the cached outputs that the backward after the
// forward needed ("backward an extra time").
TEST_F(Regressions, GradInsideASelectiveRegionWhileItsForwardRecords) {
  torch::manual_seed(0);
  auto x = torch::randn({4, 4}, torch::requires_grad());
  auto w = torch::randn({4, 4}, torch::requires_grad());
  auto f = [&](const at::Tensor& a) {
    auto h = a.mm(w);
    auto g = torch::autograd::grad({(h.sin() * w).sum()}, {a}, {}, true,
                                   /*create_graph=*/true)[0];
    return (g * h).exp();
  };
  const auto expected = run_and_grad([&] { return f(x); }, {x}, {w});
  for (const bool early_stop : {true, false}) {
    for (const bool everything : {true, false}) {
      SCOPED_TRACE(c10::str("early_stop=", early_stop, " everything=", everything));
      auto options = everything ? sac::CheckpointOptions().policy(save_everything())
                                : saving({"aten::mm", "aten::sin"});
      options.early_stop(early_stop);
      const auto actual = run_and_grad([&] { return sac::checkpoint(options, f, x); }, {x}, {w});
      expect_bit_identical(expected, actual);
    }
  }
}

// Found by the fuzzer (seeds 12422843216110423104, 16100312752680960808 and
// two more): without early stop, a recomputation that a backward inside the
// checkpointed function starts ran the whole function, past the point the
// forward had reached, and repeated the side effects that follow (here an
// in-place update of a buffer) before the forward itself ran them.
TEST_F(Regressions, RecomputationDuringTheForwardStopsWhereTheForwardIs) {
  torch::manual_seed(0);
  auto x = torch::randn({5}, torch::requires_grad());
  auto steps = torch::zeros({1});
  auto f = [&](const at::Tensor& a) {
    auto g = torch::autograd::grad({(a.sin() * a).sum()}, {a}, {}, true,
                                   /*create_graph=*/true)[0];
    steps.add_(1);  // a side effect after the inner backward
    return g * a;
  };
  const auto expected = torch::autograd::grad({f(x).sum()}, {x})[0];
  for (const bool early_stop : {true, false}) {
    SCOPED_TRACE(c10::str("early_stop=", early_stop));
    steps.zero_();
    auto y = sac::checkpoint(sac::CheckpointOptions().early_stop(early_stop), f, x);
    EXPECT_EQ(steps.item<double>(), 1) << "the forward's update ran more than once";
    const auto g = torch::autograd::grad({y.sum()}, {x})[0];
    EXPECT_TRUE(torch::equal(g, expected));
  }
}

// Found by the fuzzer (seeds 14376421427440338647, 9198960712043389342,
// 14410040958744903857, 7180687875114757864): a selective region nested in a
// full-recompute one calls grad in its forward. The inner backward unpacks
// the inner region's holders; its recomputation unpacks its arguments, which
// are the outer region's holders, so the outer region recomputes right then,
// while the inner caching mode was still active: the outer region's ops were
// recorded into the inner cache and shifted its call indices (wrong
// gradient, or a shape error in MulBackward0).
TEST_F(Regressions, RecomputationInsideAnEnclosingForwardIsSeenByItsOwnModesOnly) {
  torch::manual_seed(0);
  auto p = torch::randn({3, 3}, torch::requires_grad());
  auto q = torch::randn({2, 5}, torch::requires_grad());
  auto inner = [](const at::Tensor& a) {
    auto t = (a.sin() * a).sum();
    return torch::autograd::grad({t}, {a}, {}, std::nullopt, /*create_graph=*/true)[0];
  };
  for (const bool same_shapes : {true, false}) {
    SCOPED_TRACE(same_shapes ? "an outer mul of the inner shape" : "an outer mul of another shape");
    auto outer = [&](const at::Tensor& a, const at::Tensor& b, bool checkpointed) {
      at::Tensor h = same_shapes ? a * a + 1 : a + 1;
      at::Tensor d = same_shapes ? b : b * b;
      at::Tensor y =
          checkpointed ? sac::checkpoint(saving({"aten::mul.Tensor"}), inner, h) : inner(h);
      return y.sum() + d.sum();
    };
    const auto expected = torch::autograd::grad({outer(p, q, false)}, {p, q});
    auto loss = sac::checkpoint(
        [&](const at::Tensor& a, const at::Tensor& b) { return outer(a, b, true); }, p, q);
    const auto actual = torch::autograd::grad({loss}, {p, q});
    expect_bit_identical(expected, actual);
  }
}

// Issue 35, item 1: a custom Function whose forward re-enables grad, runs
// sac::checkpoint (with the value check) around a function that itself
// checkpoints with save_ops(mm) on detached copies of its inputs, and whose
// backward differentiates that inner graph with torch::autograd::grad. Said
// to crash (an inference-tensor error, then a segfault in the
// recomputation); not reproduced here (every variant of options, threads
// and enclosing regions exact, ASan clean): kept as a test of the shape, on
// the calling thread and on another, several iterations, with the function
// keeping no reference to the forward's locals (the recomputation calls it
// again in backward, after they are gone).
struct DifferentiatesItsNestedCheckpoints
    : torch::autograd::Function<DifferentiatesItsNestedCheckpoints> {
  static at::Tensor body(const at::Tensor& a, const at::Tensor& b) {
    return at::tanh(at::mm(a, b)).mm(b.t());
  }
  static at::Tensor function(const at::Tensor& a, const at::Tensor& b, bool checkpointed) {
    if (!checkpointed) {
      return body(a, b).sin();
    }
    return sac::checkpoint(saving({"aten::mm"}), &body, a, b).sin();
  }
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& w, bool checkpointed) {
    at::AutoGradMode grad(true);
    const at::Tensor xd = x.detach().requires_grad_();
    const at::Tensor wd = w.detach().requires_grad_();
    const at::Tensor y =
        checkpointed
            ? sac::checkpoint(
                  sac::CheckpointOptions().determinism_check(sac::DeterminismCheck::Values),
                  [](const at::Tensor& a, const at::Tensor& b) { return function(a, b, true); }, xd,
                  wd)
            : function(xd, wd, false);
    ctx->save_for_backward({y, xd, wd});
    return y.detach();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto g = torch::autograd::grad({saved[0]}, {saved[1], saved[2]}, {grads[0]});
    return {g[0], g[1], at::Tensor()};
  }
};

TEST_F(Regressions, ACustomFunctionDifferentiatingItsNestedCheckpointsIsExact) {
  torch::manual_seed(0);
  auto x = torch::randn({6, 6}, torch::requires_grad());
  auto w = torch::randn({6, 6}, torch::requires_grad());
  auto step = [&](bool checkpointed, bool other_thread) {
    const at::Tensor loss =
        (DifferentiatesItsNestedCheckpoints::apply(x, w, checkpointed) * x).sum();
    std::vector<at::Tensor> grads;
    auto backward = [&] { grads = torch::autograd::grad({loss}, {x, w}); };
    if (other_thread) {
      std::thread thread(backward);
      thread.join();
    } else {
      backward();
    }
    return grads;
  };
  for (const bool other_thread : {false, true}) {
    SCOPED_TRACE(other_thread ? "backward on another thread" : "backward on the calling thread");
    for (int iteration = 0; iteration < 3; ++iteration) {
      expect_bit_identical(step(false, other_thread), step(true, other_thread));
    }
  }
}

// Found on the way: that Function inside a selective region saves its
// arguments there, and its backward's inner grad is a backward of its own,
// which needs the region's cache a second time. It said the argument had
// been modified in place ("Pass a clone"); it says what happened.
TEST_F(Regressions, ABackwardInsideABackwardThroughASelectiveRegionSaysSo) {
  torch::manual_seed(0);
  auto x = torch::randn({6, 6}, torch::requires_grad());
  auto w = torch::randn({6, 6}, torch::requires_grad());
  const at::Tensor loss = sac::checkpoint(
      saving({"aten::sin"}),
      [](const at::Tensor& a, const at::Tensor& b) {
        return DifferentiatesItsNestedCheckpoints::apply(a.sin(), b, true).sum();
      },
      x, w);
  const std::string message = error_of<sac::CheckpointError>([&] {
    torch::autograd::grad({loss}, {x, w});
  });
  EXPECT_NE(message.find("backward an extra time"), std::string::npos) << message;
  EXPECT_NE(message.find("A backward inside another"), std::string::npos) << message;
  EXPECT_EQ(message.find("Pass a clone"), std::string::npos) << message;
}

}  // namespace regressions_test
