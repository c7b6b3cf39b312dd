// sac::fit (sac/nn/fit.h): a torch::nn model's training step planned into a
// peak in one call, the usual loop (zero_grad, forward, backward, an
// optimizer's step that makes its state), predicted to the byte.
#include "support.h"

#include <sac/nn/apply_activation_checkpointing.h>
#include <sac/nn/checkpoint_wrapper.h>
#include <sac/nn/fit.h>

namespace nn_fit_test {

using sac_test::error_of;

struct BlockImpl : torch::nn::Cloneable<BlockImpl> {
  explicit BlockImpl(int64_t width) : width(width) { reset(); }
  void reset() override {
    up = register_module("up", torch::nn::Linear(width, 4 * width));
    down = register_module("down", torch::nn::Linear(4 * width, width));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
  }
  at::Tensor forward(const at::Tensor& x) { return x + down(torch::gelu(up(norm(x)))); }
  int64_t width;
  torch::nn::Linear up{nullptr}, down{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};
TORCH_MODULE(Block);

torch::nn::Sequential model_of(int64_t width, int blocks) {
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int i = 0; i < blocks; ++i) model->push_back(Block(width));
  model->push_back(torch::nn::Linear(width, 10));
  return model;
}

// The usual step: gradients zeroed first (to none), forward, backward, and
// Adam's step, whose first call makes its state.
struct Training {
  Training(torch::nn::Sequential m, int64_t width, int64_t batch = 512)
      : model(std::move(m)),
        width(width),
        batch(batch),
        adam(model->parameters(), torch::optim::AdamOptions(1e-3)) {}
  void step() {
    adam.zero_grad();
    torch::manual_seed(1);
    const at::Tensor x = torch::randn({batch, width});
    const at::Tensor y = torch::randint(10, {batch});
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
    adam.step();
  }
  torch::nn::Sequential model;
  int64_t width, batch;
  torch::optim::Adam adam;
};

class Fit : public sac_test::CountingAllocatorTest {};

TEST_F(Fit, TheUsualLoopIsPlannedToTheByteAndTrainsExactly) {
  Training reference(model_of(32, 4), 32);
  Training training(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(reference.model->clone()),
                    32);
  ASSERT_EQ(sac::apply_activation_checkpointing(training.model, sac::modules_of_type<BlockImpl>()),
            4);
  std::vector<at::Tensor> before;
  for (const at::Tensor& p : training.model->parameters()) before.push_back(p.detach().clone());

  const auto step = [&] { training.step(); };
  // At 1.0 the plain step fits: nothing is checkpointed. Then halfway
  // between full recomputation's peak and the plain step's.
  const sac::Fit whole = sac::fit(*training.model, step, sac::Fit::fraction(1.0), {&training.adam});
  for (const auto& region : whole.regions()) EXPECT_FALSE(region.checkpointed) << region.label;
  EXPECT_EQ(whole.predicted_peak(), whole.plain_peak());
  EXPECT_EQ(whole.recompute_flops(), 0);
  // At the least peak each block recomputes its first product, `up` (the
  // second is past the recomputation's stop): 2 FLOPs a multiply-add.
  const sac::Fit least = sac::fit(*training.model, step,
                                  sac::Fit::bytes(whole.recomputation_peak()), {&training.adam});
  for (const auto& region : least.regions()) {
    EXPECT_EQ(region.recompute_flops, 2 * 512 * 32 * (4 * 32)) << region.label;
  }
  EXPECT_EQ(least.recompute_flops(), 4 * least.regions()[0].recompute_flops);
  const double fraction = static_cast<double>(whole.recomputation_peak() + whole.plain_peak()) / 2 /
                          static_cast<double>(whole.plain_peak());
  const sac::Fit plan =
      sac::fit(*training.model, step, sac::Fit::fraction(fraction), {&training.adam});
  std::ostringstream printed;
  printed << plan;
  SCOPED_TRACE(printed.str());
  ASSERT_EQ(plan.regions().size(), 4u);
  EXPECT_EQ(plan.regions()[0].label, "0");
  EXPECT_EQ(plan.plain_peak(), whole.plain_peak());
  EXPECT_EQ(plan.peak_budget(),
            static_cast<int64_t>(fraction * static_cast<double>(plan.plain_peak())));
  EXPECT_LE(plan.predicted_peak(), plan.peak_budget());
  EXPECT_LT(plan.recomputation_peak(), plan.predicted_peak());
  EXPECT_NE(printed.str().find("sac::fit: 4 regions"), std::string::npos);
  EXPECT_NE(printed.str().find("recompute MFLOP"), std::string::npos);

  // Planning put back what the step changed: weights, no gradients, no
  // optimizer state yet.
  const auto params = training.model->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(params[i].equal(before[i])) << "parameter " << i;
    EXPECT_FALSE(params[i].grad().defined()) << "parameter " << i;
  }
  EXPECT_TRUE(training.adam.state().empty());

  plan.apply(*training.model);
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const int64_t peak = sac::measure_peak([&] { training.step(); });
    if (step == 0) EXPECT_EQ(peak, plan.predicted_peak());
    EXPECT_LE(peak, plan.peak_budget());
    reference.step();
    const auto expected = reference.model->parameters();
    const auto actual = training.model->parameters();
    for (size_t i = 0; i < expected.size(); ++i) {
      ASSERT_TRUE(actual[i].equal(expected[i])) << "parameter " << i;
    }
  }
}

// A small batch: the first step peaks in Adam's step, which makes its
// state while the step still holds its batch (a local). The plain peak was
// predicted 8,192 bytes low, the batch taken for freed where the frame of
// the first region let go of it.
TEST_F(Fit, APeakAfterBackwardCountsTheBatchTheStepHolds) {
  Training reference(model_of(32, 2), 32, /*batch=*/64);
  Training training(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(reference.model->clone()),
                    32, 64);
  sac::apply_activation_checkpointing(training.model, sac::modules_of_type<BlockImpl>());
  const sac::Fit plan = sac::fit(*training.model, [&] { training.step(); }, sac::Fit::fraction(1.0),
                                 {&training.adam});
  EXPECT_EQ(plan.plain_peak(), sac::measure_peak([&] { reference.step(); }));
  plan.apply(*training.model);
  EXPECT_EQ(sac::measure_peak([&] { training.step(); }), plan.predicted_peak());
}

TEST_F(Fit, WhatCannotBePlannedIsAClearError) {
  Training training(model_of(16, 2), 16);
  const auto step = [&] { training.step(); };
  std::string message =
      error_of([&] { sac::fit(*training.model, step, sac::Fit::fraction(0.5), {&training.adam}); });
  EXPECT_NE(message.find("the step ran no checkpoint wrapper"), std::string::npos) << message;

  sac::apply_activation_checkpointing(training.model, sac::modules_of_type<BlockImpl>());
  message =
      error_of([&] { sac::fit(*training.model, step, sac::Fit::bytes(1), {&training.adam}); });
  EXPECT_NE(message.find("is below the step's least"), std::string::npos) << message;
  EXPECT_NE(message.find("Raise the peak"), std::string::npos) << message;

  message = error_of([] { sac::Fit::fraction(1.5); });
  EXPECT_NE(message.find("in (0, 1]"), std::string::npos) << message;

  const sac::Fit plan = sac::fit(*training.model, step, sac::Fit::fraction(1.0), {&training.adam});
  auto copy = training.model->clone();
  message = error_of([&] { plan.apply(*copy); });
  EXPECT_NE(message.find("a plan applies to the model it was made for"), std::string::npos)
      << message;

  // One wrapper run twice in a step (its weights shared): one policy cannot
  // plan two calls.
  torch::nn::Module twice;
  auto shared = twice.register_module("shared", sac::checkpoint_wrapper(Block(16)));
  message = error_of([&] {
    sac::fit(
        twice,
        [&] {
          shared->forward(shared->forward(torch::randn({4, 16}))).sum().backward();
        },
        sac::Fit::fraction(1.0));
  });
  EXPECT_NE(message.find("ran twice in one step"), std::string::npos) << message;
}

}  // namespace nn_fit_test
