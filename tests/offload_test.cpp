// sac::OffloadGuard and sac::OffloadWrapper on a CPU-only machine: the copy
// target is an arena outside the counting allocator, so the bytes that leave
// "the device" (counted) and arrive in the target (the arena) are exact.
#include "support.h"

#include <sac/nn/checkpoint_wrapper.h>
#include <sac/nn/offload_wrapper.h>
#include <sac/offload/offload.h>

#include "examples/host_arena.h"

namespace offload_test {

using sac_test::CountingAllocator;

using sac_examples::HostArena;

struct Net {
  Net() {
    torch::manual_seed(0);
    fc1 = torch::nn::Linear(32, 64);
    fc2 = torch::nn::Linear(64, 32);
  }
  at::Tensor forward(const at::Tensor& x) {
    return fc2->forward(torch::gelu(fc1->forward(x))).tanh();
  }
  std::vector<at::Tensor> parameters() {
    auto p = fc1->parameters();
    for (const auto& q : fc2->parameters()) p.push_back(q);
    return p;
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

// Live bytes (beyond the output) after forward, then gradients.
struct Outcome {
  int64_t kept = 0;
  int64_t arena = 0;
  std::vector<at::Tensor> grads;
};

Outcome run(Net& net, const at::Tensor& x, const std::function<at::Tensor()>& forward,
            const HostArena* arena = nullptr) {
  Outcome result;
  const int64_t base = CountingAllocator::live_bytes();
  at::Tensor y = forward();
  result.kept = CountingAllocator::live_bytes() - base - static_cast<int64_t>(y.nbytes());
  result.arena = arena != nullptr ? arena->held() : 0;
  auto inputs = net.parameters();
  inputs.insert(inputs.begin(), x);
  result.grads = torch::autograd::grad({y.sum()}, inputs);
  return result;
}

TEST(OffloadGuard, SavedTensorsLiveInTheTargetAndComeBackBitIdentical) {
  sac_test::expect_configured_mechanism();
  CountingAllocator::install();
  Net net;
  auto x = torch::randn({16, 32}, torch::requires_grad());
  const Outcome plain = run(net, x, [&] { return net.forward(x); });
  ASSERT_GT(plain.kept, 0);

  auto arena = std::make_shared<HostArena>();
  const Outcome offloaded = run(
      net, x,
      [&] {
        sac::OffloadGuard offload(
            sac::OffloadOptions().target(arena).leave_in_place(net.parameters()));
        return net.forward(x);
      },
      arena.get());
  // Nothing stays on "the device": fc1's output (for gelu), gelu's output
  // (for fc2), tanh's output and x went to the arena; the weights stayed.
  EXPECT_EQ(offloaded.kept, 0);
  EXPECT_EQ(offloaded.arena, (16 * 64 + 16 * 64 + 16 * 32 + 16 * 32) * 4);
  EXPECT_EQ(arena->held(), 0) << "the copies go with the graph";
  EXPECT_EQ(arena->returns(), arena->copies());
  sac_test::expect_bit_identical(plain.grads, offloaded.grads);
}

TEST(OffloadGuard, ComposesWithASelectivePolicy) {
  sac_test::expect_configured_mechanism();
  CountingAllocator::install();
  Net net;
  auto x = torch::randn({16, 32}, torch::requires_grad());
  auto policy = sac::CheckpointOptions().policy(sac::Policy::save_ops({"aten::addmm"}));
  auto checkpointed = [&] {
    return sac::checkpoint(
        policy, [&](const at::Tensor& in) { return net.forward(in); }, x);
  };
  const Outcome plain = run(net, x, [&] { return net.forward(x); });
  const Outcome on_device = run(net, x, checkpointed);
  // The policy keeps both addmm outputs; tanh's output is outside no region
  // here: the whole net is the region, its output is the region's.
  EXPECT_EQ(on_device.kept, (16 * 64 + 16 * 32) * 4);

  auto arena = std::make_shared<HostArena>();
  const Outcome offloaded = run(
      net, x,
      [&] {
        sac::OffloadGuard offload(
            sac::OffloadOptions().target(arena).leave_in_place(net.parameters()));
        return checkpointed();
      },
      arena.get());
  EXPECT_EQ(offloaded.kept, 0) << "the policy's cache went to the target too";
  // The cached addmm outputs and the checkpoint's input x.
  EXPECT_EQ(offloaded.arena, (16 * 64 + 16 * 32 + 16 * 32) * 4);
  EXPECT_EQ(arena->held(), 0);
  sac_test::expect_bit_identical(plain.grads, on_device.grads);
  sac_test::expect_bit_identical(plain.grads, offloaded.grads);
}

TEST(OffloadGuard, SmallTensorsStayAndTheTargetDecides) {
  sac_test::expect_configured_mechanism();
  CountingAllocator::install();
  Net net;
  auto x = torch::randn({16, 32}, torch::requires_grad());
  const Outcome plain = run(net, x, [&] { return net.forward(x); });
  auto arena = std::make_shared<HostArena>();
  // 16 x 32 floats are 2048 bytes: only the 16 x 64 tensors (4096) move.
  const Outcome limited = run(
      net, x,
      [&] {
        sac::OffloadGuard offload(
            sac::OffloadOptions().target(arena).leave_in_place(net.parameters()).min_bytes(4096));
        return net.forward(x);
      },
      arena.get());
  EXPECT_EQ(limited.arena, 2 * 16 * 64 * 4);
  EXPECT_EQ(limited.kept, 0) << "what stays is x and tanh's output, counted elsewhere";
  sac_test::expect_bit_identical(plain.grads, limited.grads);
  // The default target moves accelerator tensors only: on the CPU nothing.
  const Outcome host = run(net, x, [&] {
    sac::OffloadGuard offload;
    return net.forward(x);
  });
  EXPECT_EQ(host.kept, plain.kept);
  sac_test::expect_bit_identical(plain.grads, host.grads);
}

TEST(OffloadGuard, AModifiedSavedTensorIsAnErrorAtBackward) {
  sac_test::expect_configured_mechanism();
  auto arena = std::make_shared<HostArena>();
  auto x = torch::randn({4, 8}, torch::requires_grad());
  at::Tensor y;
  at::Tensor h = x * 2;
  {
    sac::OffloadGuard offload(sac::OffloadOptions().target(arena));
    y = h.sin();
  }
  {
    torch::NoGradGuard no_grad;
    h.add_(1);
  }
  const auto message = sac_test::error_of([&] { y.sum().backward(); });
  EXPECT_NE(message.find("modified in place after it was saved"), std::string::npos) << message;
}

TEST(OffloadGuard, NestsAndLeavesNothingBehindOnException) {
  sac_test::expect_configured_mechanism();
  auto outer = std::make_shared<HostArena>();
  auto inner = std::make_shared<HostArena>();
  auto x = torch::randn({4, 8}, torch::requires_grad());
  at::Tensor a, b, c;
  {
    sac::OffloadGuard first(sac::OffloadOptions().target(outer));
    {
      sac::OffloadGuard second(sac::OffloadOptions().target(inner));
      a = x.sin();
    }
    b = x.cos();
  }
  EXPECT_EQ(inner->copies(), 1);
  EXPECT_EQ(outer->copies(), 1);
  try {
    sac::OffloadGuard failing(sac::OffloadOptions().target(inner));
    throw std::runtime_error("forward failed");
  } catch (const std::runtime_error&) {
  }
  c = x.exp();  // after the guards: saved where autograd saves it
  EXPECT_EQ(inner->copies(), 1);
  EXPECT_EQ(outer->copies(), 1);
  (a + b + c).sum().backward();
  EXPECT_TRUE(torch::allclose(x.grad(), x.cos() - x.sin() + x.exp()));
}

// ---- sac::OffloadWrapper ------------------------------------------------------

TEST(OffloadWrapper, KeepsNamesLeavesParametersAndComposesWithTheCheckpointWrapper) {
  sac_test::expect_configured_mechanism();
  CountingAllocator::install();
  torch::manual_seed(0);
  auto block = torch::nn::Sequential(torch::nn::Linear(32, 64), torch::nn::GELU(),
                                     torch::nn::Linear(64, 32));
  auto arena = std::make_shared<HostArena>();
  auto offloaded = sac::offload_wrapper(block, sac::OffloadOptions().target(arena));
  auto both = sac::offload_wrapper(
      sac::checkpoint_wrapper(
          block, sac::CheckpointOptions().policy(sac::Policy::save_ops({"aten::addmm"}))),
      sac::OffloadOptions().target(arena));
  const auto names = block->named_parameters().keys();
  EXPECT_EQ(offloaded->named_parameters().keys(), names);
  EXPECT_EQ(both->named_parameters().keys(), names);

  auto x = torch::randn({16, 32}, torch::requires_grad());
  auto params = block->parameters();
  const auto expected = sac_test::run_and_grad([&] { return block->forward(x); }, {x}, params);
  const std::vector<std::function<at::Tensor()>> wrapped = {[&] { return offloaded->forward(x); },
                                                            [&] { return both->forward(x); }};
  for (size_t i = 0; i < wrapped.size(); ++i) {
    const auto& forward = wrapped[i];
    const int64_t base = CountingAllocator::live_bytes();
    at::Tensor y = forward();
    EXPECT_EQ(CountingAllocator::live_bytes() - base, static_cast<int64_t>(y.nbytes()));
    // x, fc1's output and gelu's output (plain), or x and the two cached
    // addmm outputs (checkpointed); never a parameter.
    EXPECT_EQ(arena->held(), (16 * 32 + 16 * 64 + (i == 0 ? 16 * 64 : 16 * 32)) * 4);
    y = at::Tensor();
    const auto actual = sac_test::run_and_grad(forward, {x}, params);
    sac_test::expect_bit_identical(expected, actual);
  }
}

}  // namespace offload_test
