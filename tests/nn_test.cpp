// torch::nn integration: sac::checkpoint_sequential.
#include "support.h"

#include <sac/nn/checkpoint_sequential.h>

namespace {

using sac_test::CountingAllocator;

torch::nn::Sequential six_modules() {
  return torch::nn::Sequential(torch::nn::Linear(16, 32), torch::nn::ReLU(),
                               torch::nn::Linear(32, 32), torch::nn::GELU(),
                               torch::nn::Linear(32, 8), torch::nn::ReLU());
}

TEST(CheckpointSequential, GradientsBitIdenticalForEverySegmentCount) {
  sac_test::expect_configured_mechanism();
  torch::manual_seed(0);
  auto model = six_modules();
  auto x = torch::randn({4, 16}, torch::requires_grad());
  const auto params = model->parameters();
  const auto expected = sac_test::run_and_grad([&] { return model->forward(x); }, {x}, params);
  for (int64_t segments = 1; segments <= 6; ++segments) {
    for (const auto& options :
         {sac::CheckpointOptions(),
          sac::CheckpointOptions().policy(sac::Policy::save_ops({"aten::addmm"}))}) {
      const auto actual = sac_test::run_and_grad(
          [&] { return sac::checkpoint_sequential(model, segments, x, options); }, {x}, params);
      SCOPED_TRACE("segments " + std::to_string(segments));
      sac_test::expect_bit_identical(expected, actual);
    }
  }
}

// Three segments of two modules: the first two are checkpointed and keep
// only their outputs (the next segment's input); the last keeps what
// autograd saves (its Linear's input, its ReLU's output).
TEST(CheckpointSequential, KeepsTheSegmentBoundariesOnly) {
  sac_test::expect_configured_mechanism();
  CountingAllocator::install();
  torch::manual_seed(0);
  auto model = six_modules();
  auto x = torch::randn({4, 16}, torch::requires_grad());
  sac::checkpoint_sequential(model, 3, x).sum().backward();  // warm-up
  const int64_t base = CountingAllocator::live_bytes();
  {
    auto y = sac::checkpoint_sequential(model, 3, x);
    EXPECT_EQ(CountingAllocator::live_bytes() - base, (4 * 32 + 4 * 32 + 4 * 8) * 4);
    y.sum().backward();
  }
  EXPECT_EQ(CountingAllocator::live_bytes(), base);
  {
    auto y = model->forward(x);
    EXPECT_GT(CountingAllocator::live_bytes() - base, (4 * 32 + 4 * 32 + 4 * 8) * 4)
        << "without checkpointing more stays";
  }
}

TEST(CheckpointSequential, UsesTheScopesOptionsAndChecksSegments) {
  sac_test::expect_configured_mechanism();
  auto model = six_modules();
  auto x = torch::randn({4, 16}, torch::requires_grad());
  auto asked = std::make_shared<int>(0);
  {
    sac::CheckpointScope scope(sac::CheckpointOptions().policy(sac::Policy::from_fn(
        [asked](const sac::SelectiveCheckpointContext&, const c10::OperatorHandle&,
                c10::ArrayRef<c10::IValue>) {
          ++*asked;
          return false;
        })));
    sac::checkpoint_sequential(model, 2, x);
  }
  EXPECT_GT(*asked, 0);
  for (const int64_t segments : {0, 7}) {
    const auto message =
        sac_test::error_of([&] { sac::checkpoint_sequential(model, segments, x); });
    EXPECT_NE(message.find("segments must be between 1 and the number of modules"),
              std::string::npos)
        << message;
  }
}

}  // namespace
