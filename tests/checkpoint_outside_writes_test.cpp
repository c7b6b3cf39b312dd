// Tensors from outside that a checkpointed function writes (issue 58): a
// buffer written whole, by an out= op or in part, read in the region or by
// a region nested in it, backwarded once, twice, for a second loss, or to a
// second order. Each program is exact without checkpointing, and each test
// failed before the fix it names.
#include "support.h"

namespace checkpoint_outside_writes_test {

using sac_test::error_of;
using sac_test::expect_bit_identical;

class OutsideWrites : public ::testing::Test {
 protected:
  void SetUp() override { sac_test::expect_configured_mechanism(); }
};

// How a function writes `buf` from `in`.
enum class Write { Copy, ThroughView, OutOp, InPart };

void write(Write how, at::Tensor& buf, const at::Tensor& in) {
  switch (how) {
    case Write::Copy: buf.copy_(in.sin()); return;
    case Write::ThroughView: buf.view(-1).copy_(in.sin().reshape(-1)); return;
    case Write::OutOp: {
      const at::Tensor d = in.detach();
      at::mul_out(buf, d, d);
      return;
    }
    case Write::InPart: buf.narrow(0, 0, 2).copy_(in.narrow(0, 0, 2).sin()); return;
  }
}

const char* name(Write how) {
  const char* names[] = {"copy_", "view(-1).copy_", "mul_out", "narrow(0, 0, 2).copy_"};
  return names[static_cast<int>(how)];
}

// The gradients with respect to a and w of a function that writes the
// buffer and reads it, inside `depth` functions, each checkpointed or not,
// the writer innermost, backwarded twice (retain_graph).
std::vector<at::Tensor> nested(Write how, int depth, bool checkpointed) {
  torch::manual_seed(0);
  auto a = torch::randn({3, 4}, torch::requires_grad());
  auto w = torch::randn({4}, torch::requires_grad());
  auto buf = torch::ones({3, 4});
  std::function<at::Tensor(const at::Tensor&)> f = [&](const at::Tensor& in) {
    write(how, buf, in);
    return (in + buf).tanh() * w;
  };
  const auto call = [checkpointed](const std::function<at::Tensor(const at::Tensor&)>& g,
                                   const at::Tensor& in) {
    return checkpointed ? sac::checkpoint(g, in) : g(in);
  };
  for (int level = 1; level < depth; ++level) {
    f = [inner = f, call](const at::Tensor& in) { return call(inner, in.cos()) * in; };
  }
  const at::Tensor y = call(f, a).sum();
  auto grads = torch::autograd::grad({y}, {a, w}, {}, /*retain_graph=*/true);
  const auto again = torch::autograd::grad({y}, {a, w});
  grads.insert(grads.end(), again.begin(), again.end());
  return grads;
}

// A RecordFunction names an op without its overload: at::mul_out was taken
// for aten::mul.Tensor, which writes nothing, and under per-op kernels the
// buffer it overwrote was "modified in place after the forward read it"
// (found by the fuzzer outside, nested; it failed at every depth). A buffer
// written in part was blamed too, for the recomputation's own write of the
// same bytes (Note [Rewritten by a recomputation]).
TEST_F(OutsideWrites, WrittenWholeOrInPartThenReadIsExactAtEveryDepth) {
  for (const Write how : {Write::Copy, Write::ThroughView, Write::OutOp, Write::InPart}) {
    for (const int depth : {1, 2, 3}) {
      SCOPED_TRACE(std::string(name(how)) + " at depth " + std::to_string(depth));
      expect_bit_identical(nested(how, depth, false), nested(how, depth, true));
    }
  }
}

// The write in part is watched by the bytes the region read: a change of the
// rows it did not write, between forward and backward, is still caught.
TEST_F(OutsideWrites, TheRowsAWriteInPartLeftAreStillWatched) {
  torch::manual_seed(0);
  auto a = torch::randn({3, 4}, torch::requires_grad());
  auto buf = torch::ones({3, 4});
  auto f = [&](const at::Tensor& in) {
    write(Write::InPart, buf, in);
    return (in * buf).tanh();
  };
  const at::Tensor y = sac::checkpoint(f, a).sum();
  {
    torch::NoGradGuard no_grad;
    buf.narrow(0, 2, 1).mul_(2);
  }
  const std::string message = error_of<sac::CheckpointError>([&] { y.backward(); });
  EXPECT_NE(message.find("was modified in place after the forward read it"), std::string::npos)
      << message;
}

// The gradient of the squared first-order gradients with respect to a
// buffer the function overwrote with grad: the recomputation's copy_ gave the
// buffer a grad_fn of the recomputation's graph, which backward never runs,
// so the gradient was undefined (as under PyTorch's checkpoint, which gives
// None), and a's was off where the buffer's history fed it. Note [A
// recomputation keeps their history].
std::vector<at::Tensor> second_order(bool checkpointed, bool written_between) {
  torch::manual_seed(0);
  auto a = torch::randn({4}, torch::requires_grad());
  auto buf = torch::zeros({4});
  auto f = [&](const at::Tensor& in) {
    buf.copy_(in);
    return in * buf.mean();
  };
  const at::Tensor out = checkpointed ? sac::checkpoint(f, a) : f(a);
  if (written_between) {
    torch::NoGradGuard no_grad;
    buf.fill_(7);
  }
  const at::Tensor g =
      torch::autograd::grad({out.sum()}, {a}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
  auto grads = torch::autograd::grad({(g * g).sum()}, {a, buf}, {}, std::nullopt, false,
                                     /*allow_unused=*/true);
  grads.insert(grads.begin(), g.detach());
  return grads;
}

TEST_F(OutsideWrites, ASecondOrderGradientThroughAWrittenBufferIsThePlainOne) {
  for (const bool written_between : {false, true}) {
    SCOPED_TRACE(written_between ? "buf.fill_(7) under no_grad before backward" : "");
    const auto expected = second_order(false, written_between);
    ASSERT_TRUE(expected[2].defined()) << "the plain run's gradient of the buffer";
    const auto actual = second_order(true, written_between);
    ASSERT_TRUE(actual[2].defined()) << "the gradient with respect to the buffer is undefined";
    expect_bit_identical(expected, actual);
  }
}

// Two losses (the second after a retain_graph), the buffer saved by the op
// that reads it: exact with the outside-tensor check on. With it off, sac
// cannot tell the recomputation's write from the user's, and its error says
// so: it said "Autograd would raise this error without checkpointing too",
// false for this program.
std::vector<at::Tensor> two_losses(Write how, const sac::CheckpointOptions* options) {
  torch::manual_seed(0);
  auto a = torch::randn({3, 4}, torch::requires_grad());
  auto w = torch::randn({4}, torch::requires_grad());
  auto buf = torch::ones({3, 4});
  auto f = [&](const at::Tensor& in) {
    write(how, buf, in);
    return (buf * w).sin();
  };
  const at::Tensor y = options ? sac::checkpoint(*options, f, a) : f(a);
  // The out= op writes a's values without its graph.
  const std::vector<at::Tensor> wrt =
      how == Write::OutOp ? std::vector<at::Tensor>{w} : std::vector<at::Tensor>{a, w};
  auto grads = torch::autograd::grad({y.sum()}, wrt, {}, /*retain_graph=*/true);
  const auto second = torch::autograd::grad({(y * y).sum()}, wrt);
  grads.insert(grads.end(), second.begin(), second.end());
  return grads;
}

TEST_F(OutsideWrites, TwoLossesAreExactAndTheCheckOffSaysWhatItCannotTell) {
  for (const Write how : {Write::Copy, Write::ThroughView, Write::OutOp, Write::InPart}) {
    SCOPED_TRACE(name(how));
    const auto expected = two_losses(how, nullptr);
    const auto checked = sac::CheckpointOptions();
    expect_bit_identical(expected, two_losses(how, &checked));
    const auto unchecked = sac::CheckpointOptions().outside_tensor_check(false);
    const std::string message = error_of([&] { two_losses(how, &unchecked); });
    EXPECT_NE(message.find("unless the change is a checkpointed region's recomputation"),
              std::string::npos)
        << message;
    EXPECT_EQ(message.find("would raise this error without checkpointing too"), std::string::npos)
        << message;
  }
}

// A function that threw, caught by the caller, whose intermediate is then
// backwarded: sac::checkpoint recomputes up to what the forward saved
// (exact, as without checkpointing); a region guard keeps nothing to
// recompute from and says so.
TEST_F(OutsideWrites, ARegionThatThrewAndWasCaught) {
  auto x = torch::randn({4}, torch::requires_grad());
  const auto throws_after = [](const std::shared_ptr<at::Tensor>& h, const at::Tensor& in) {
    *h = in.sin().exp();
    throw std::runtime_error("the user's own error");
    return *h;
  };
  const auto expected = torch::autograd::grad({x.sin().exp().sum()}, {x})[0];
  auto h = std::make_shared<at::Tensor>();
  EXPECT_THROW(sac::checkpoint([&, h](const at::Tensor& in) { return throws_after(h, in); }, x),
               std::runtime_error);
  EXPECT_TRUE(torch::equal(torch::autograd::grad({h->sum()}, {x})[0], expected));
  if (sac::dispatch::mechanism() != sac::dispatch::Mechanism::FallbackKey) {
    return;  // region guards record under the fallback key only
  }
  at::Tensor k;
  try {
    sac::CheckpointRegion region;
    k = x.sin().exp();
    throw std::runtime_error("the user's own error");
  } catch (const std::runtime_error&) {
  }
  const std::string message = error_of<sac::CheckpointError>([&] { k.sum().backward(); });
  EXPECT_NE(message.find("the region ended with an exception"), std::string::npos) << message;
}

}  // namespace checkpoint_outside_writes_test
