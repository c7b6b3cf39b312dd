// CUDA: the recomputation sees the forward's CUDA RNG state; offload to
// pinned host memory with its streams and prefetch; regions on a device that
// is not the current one; autocast; a backward inside a checkpointed forward,
// whose device nodes run on the engine's CUDA thread. Every comparison is bit
// for bit, so each test runs with deterministic algorithms. Skips (saying
// why) where no GPU is available, as on CI.
#include "support.h"

#include <sac/dispatch/internal/interceptor.h>
#include <sac/offload/offload.h>

#include <ATen/autocast_mode.h>

#include <cstdlib>

namespace cuda_test {

// Deterministic kernels, set before the first cuBLAS handle is made.
bool deterministic_cuda() {
  if (!torch::cuda::is_available()) return false;
  static const bool once = [] {
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
    return true;
  }();
  return once;
}

#define SKIP_WITHOUT_CUDA()                                                \
  if (!deterministic_cuda()) {                                             \
    GTEST_SKIP() << "no CUDA device: this LibTorch or machine has no GPU"; \
  }                                                                        \
  sac_test::expect_configured_mechanism()

// A GPT block with dropout on `device`, from seed 0.
sac_test::GptBlock gpt_block_on(const torch::Device& device) {
  torch::manual_seed(0);
  sac_test::GptBlock block(64, 4, /*dropout=*/0.1);
  block->to(device);
  return block;
}

at::TensorOptions on_cuda(int index = 0) {
  return torch::TensorOptions().device(torch::Device(torch::kCUDA, index));
}

TEST(Cuda, DropoutGradientsBitIdenticalUnderSelectiveCheckpoint) {
  SKIP_WITHOUT_CUDA();
  auto block = gpt_block_on(torch::kCUDA);
  auto x =
      torch::randn({2, 32, 64}, torch::TensorOptions().device(torch::kCUDA).requires_grad(true));
  const auto params = block->parameters();
  auto run = [&](const at::Tensor& in) { return block->forward(in); };
  const auto expected = sac_test::run_and_grad([&] { return run(x); }, {x}, params);
  for (const auto& policy :
       {sac::Policy::save_ops({"aten::addmm"}),
        sac::Policy::from_fn([](const sac::SelectiveCheckpointContext&, const c10::OperatorHandle&,
                                c10::ArrayRef<c10::IValue>) { return true; })}) {
    const auto actual = sac_test::run_and_grad(
        [&] { return sac::checkpoint(sac::CheckpointOptions().policy(policy), run, x); }, {x},
        params);
    sac_test::expect_bit_identical(expected, actual);
  }
}

// A region guard on CUDA: the replay restores the current device's
// generator (the guard has no inputs to take devices from).
TEST(Cuda, DropoutGradientsBitIdenticalUnderRegionGuard) {
  SKIP_WITHOUT_CUDA();
  if (!sac::detail::observers_see_every_op()) {
    GTEST_SKIP() << "sac::CheckpointRegion needs the fallback key";
  }
  auto block = gpt_block_on(torch::kCUDA);
  auto x =
      torch::randn({2, 32, 64}, torch::TensorOptions().device(torch::kCUDA).requires_grad(true));
  const auto params = block->parameters();
  const auto expected = sac_test::run_and_grad([&] { return block->forward(x); }, {x}, params);
  for (const auto& options :
       {sac::CheckpointOptions(),
        sac::CheckpointOptions().policy(sac::Policy::save_ops({"aten::addmm"}))}) {
    const auto actual = sac_test::run_and_grad(
        [&] {
          sac::CheckpointRegion region(options);
          return block->forward(x);
        },
        {x}, params);
    sac_test::expect_bit_identical(expected, actual);
  }
}

// Saved tensors through pinned host memory and back, broadcast and gapped
// views among them (issue 22, item 2), under an OffloadGuard alone and
// around a checkpoint.
TEST(Cuda, OffloadGuardToPinnedHostMemoryIsBitIdentical) {
  SKIP_WITHOUT_CUDA();
  auto block = gpt_block_on(torch::kCUDA);
  auto x = torch::randn({2, 32, 64}, on_cuda().requires_grad(true));
  auto bias = torch::randn({64}, on_cuda().requires_grad(true));
  const auto params = block->parameters();
  auto run = [&](const at::Tensor& in) {
    const auto h = block->forward(in) * bias.expand({2, 32, 64});  // stride 0
    const auto parts = h.split(16, /*dim=*/2);                     // gapped views
    return (parts[0] * parts[1].sin()).sum() + (parts[2] * parts[3]).sum();
  };
  const auto expected = sac_test::run_and_grad([&] { return run(x); }, {x, bias}, params);
  const auto offloaded = sac_test::run_and_grad(
      [&] {
        sac::OffloadGuard offload;
        return run(x);
      },
      {x, bias}, params);
  sac_test::expect_bit_identical(expected, offloaded);
  const auto around_checkpoint = sac_test::run_and_grad(
      [&] {
        sac::OffloadGuard offload;
        return sac::checkpoint(
            sac::CheckpointOptions().policy(sac::Policy::save_ops({"aten::addmm"})), run, x);
      },
      {x, bias}, params);
  sac_test::expect_bit_identical(expected, around_checkpoint);
}

// Offload answers: the outputs go to pinned host memory in the forward and
// are prefetched when the recomputation starts (item 4).
TEST(Cuda, OffloadAnswersPrefetchedAreBitIdentical) {
  SKIP_WITHOUT_CUDA();
  auto block = gpt_block_on(torch::kCUDA);
  auto x = torch::randn({2, 32, 64}, on_cuda().requires_grad(true));
  const auto params = block->parameters();
  auto run = [&](const at::Tensor& in) { return block->forward(in); };
  const auto expected = sac_test::run_and_grad([&] { return run(x); }, {x}, params);
  const auto options = sac::CheckpointOptions().policy(
      sac::Policy::answer_ops({"aten::addmm"}, sac::CheckpointPolicy::MustCpuOffload));
  const auto actual =
      sac_test::run_and_grad([&] { return sac::checkpoint(options, run, x); }, {x}, params);
  sac_test::expect_bit_identical(expected, actual);
}

// A region on cuda:1 while cuda:0 is current: its dropout replays from the
// generator of cuda:1, restored (item 5).
TEST(Cuda, RegionsOnANonCurrentDeviceReplayItsGenerator) {
  SKIP_WITHOUT_CUDA();
  if (torch::cuda::device_count() < 2) {
    GTEST_SKIP() << "needs two CUDA devices";
  }
  auto block = gpt_block_on(torch::Device(torch::kCUDA, 1));
  auto x = torch::randn({2, 32, 64}, on_cuda(1).requires_grad(true));
  const auto params = block->parameters();
  auto run = [&](const at::Tensor& in) { return block->forward(in); };
  const auto expected = sac_test::run_and_grad([&] { return run(x); }, {x}, params);
  const c10::DeviceGuard current(torch::Device(torch::kCUDA, 0));
  sac_test::expect_bit_identical(
      expected, sac_test::run_and_grad([&] { return sac::checkpoint(run, x); }, {x}, params));
  if (sac::detail::observers_see_every_op()) {
    sac_test::expect_bit_identical(expected, sac_test::run_and_grad(
                                                 [&] {
                                                   sac::CheckpointRegion region;
                                                   return run(x);
                                                 },
                                                 {x}, params));
  }
}

// Autocast is captured with the forward and replayed in the recomputation
// (item 6).
TEST(Cuda, AutocastIsReplayedInTheRecomputation) {
  SKIP_WITHOUT_CUDA();
  auto block = gpt_block_on(torch::kCUDA);
  auto x = torch::randn({2, 32, 64}, on_cuda().requires_grad(true));
  const auto params = block->parameters();
  auto run = [&](const at::Tensor& in) { return block->forward(in); };
  auto autocast = [&](const std::function<at::Tensor()>& f) {
    return [f] {
      at::autocast::set_autocast_enabled(at::kCUDA, true);
      at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
      auto y = f();
      at::autocast::set_autocast_enabled(at::kCUDA, false);
      at::autocast::clear_cache();
      return y.to(at::kFloat);
    };
  };
  const auto expected = sac_test::run_and_grad(autocast([&] { return run(x); }), {x}, params);
  for (const auto& options :
       {sac::CheckpointOptions(),
        sac::CheckpointOptions().policy(sac::Policy::save_ops({"aten::addmm"}))}) {
    sac_test::expect_bit_identical(
        expected, sac_test::run_and_grad(autocast([&] { return sac::checkpoint(options, run, x); }),
                                         {x}, params));
  }
}

// A gradient taken inside a checkpointed forward: its CUDA nodes run on the
// engine's device thread, which sees the region's hooks and modes (item 3).
TEST(Cuda, ABackwardInsideTheForwardRunsOnTheDeviceThreadInsideTheRegion) {
  SKIP_WITHOUT_CUDA();
  auto x = torch::randn({4, 16}, on_cuda().requires_grad(true));
  auto w = torch::randn({16, 16}, on_cuda().requires_grad(true));
  auto f = [&](const at::Tensor& a) {
    const auto h = a.mm(w).tanh();
    const auto g = torch::autograd::grad({h.sum()}, {a}, {}, true, /*create_graph=*/true)[0];
    return (g * a.sin()).sum();
  };
  const auto expected = torch::autograd::grad({f(x)}, {x, w});
  for (const auto& options : {sac::CheckpointOptions(), sac::CheckpointOptions().policy(
                                                            sac::Policy::save_ops({"aten::mm"}))}) {
    const auto y = sac::checkpoint(options, f, x);
    sac_test::expect_bit_identical(expected, torch::autograd::grad({y}, {x, w}));
  }
}

}  // namespace cuda_test
