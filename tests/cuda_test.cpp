// CUDA: the recomputation sees the forward's CUDA RNG state. Skips (saying
// why) where no GPU is available, as on CI.
#include "support.h"

namespace {

TEST(Cuda, DropoutGradientsBitIdenticalUnderSelectiveCheckpoint) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device: this LibTorch or machine has no GPU";
  }
  sac_test::expect_configured_mechanism();
  torch::manual_seed(0);
  sac_test::GptBlock block(64, 4, /*dropout=*/0.1);
  block->to(torch::kCUDA);
  auto x = torch::randn({2, 32, 64}, torch::TensorOptions().device(torch::kCUDA).requires_grad(true));
  const auto params = block->parameters();
  auto run = [&](const at::Tensor& in) { return block->forward(in); };
  const auto expected = sac_test::run_and_grad([&] { return run(x); }, {x}, params);
  for (const auto& policy : {sac::Policy::save_ops({"aten::addmm"}),
                             sac::Policy::from_fn([](const sac::SelectiveCheckpointContext&,
                                                     const c10::OperatorHandle&, c10::ArrayRef<c10::IValue>) {
                               return true;
                             })}) {
    const auto actual = sac_test::run_and_grad(
        [&] { return sac::checkpoint(sac::CheckpointOptions().policy(policy), run, x); }, {x}, params);
    sac_test::expect_bit_identical(expected, actual);
  }
}

// A region guard on CUDA: the replay restores the current device's
// generator (the guard has no inputs to take devices from).
TEST(Cuda, DropoutGradientsBitIdenticalUnderRegionGuard) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device: this LibTorch or machine has no GPU";
  }
  sac_test::expect_configured_mechanism();
  if (!sac::dispatch::observers_see_every_op()) {
    GTEST_SKIP() << "sac::CheckpointRegion needs the fallback key";
  }
  torch::manual_seed(0);
  sac_test::GptBlock block(64, 4, /*dropout=*/0.1);
  block->to(torch::kCUDA);
  auto x = torch::randn({2, 32, 64}, torch::TensorOptions().device(torch::kCUDA).requires_grad(true));
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

}  // namespace
