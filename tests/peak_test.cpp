// A training step's peak under a plan, predicted from one step under full
// recomputation (sac/lab/peak.h), against the peak the counting allocator
// measures for the step under that plan.
#include "tests/support.h"

#include <sac/sac.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

namespace {

using sac_test::CountingAllocator;
using sac_test::GptBlock;

class Peak : public ::testing::Test {
 protected:
  void SetUp() override {
    sac_test::expect_configured_mechanism();
    CountingAllocator::install();
    at::set_num_threads(1);
  }
};

sac::MemoryProbe counting_probe() {
  return {[] { return CountingAllocator::live_bytes(); },
          [] { return CountingAllocator::peak_bytes(); }, [] { CountingAllocator::reset_peak(); }};
}

// Four GPT blocks, each one region.
struct Model {
  std::vector<GptBlock> blocks;
  at::Tensor x;

  Model() {
    torch::manual_seed(0);
    for (int i = 0; i < 4; ++i) {
      blocks.push_back(GptBlock(64, 4, 0.1));
    }
    set_length(32);
  }

  // The input: a batch of 2 sequences of `length` tokens.
  void set_length(int64_t length) {
    torch::manual_seed(length);
    x = torch::randn({2, length, 64}, torch::requires_grad());
  }

  // The gradients of the last step: x's, then the blocks' parameters'.
  std::vector<at::Tensor> gradients() {
    std::vector<at::Tensor> out{x.grad()};
    for (auto& block : blocks) {
      for (auto& p : block->parameters()) {
        out.push_back(p.grad());
      }
    }
    return out;
  }

  // A step without checkpointing: its gradients.
  std::vector<at::Tensor> plain_gradients() {
    zero_grad();
    torch::manual_seed(7);
    at::Tensor h = x;
    for (GptBlock& block : blocks) {
      h = block->forward(h);
    }
    h.sum().backward();
    return gradients();
  }

  // Drops the gradients, so that every step allocates them as the first
  // does.
  void zero_grad() {
    x.mutable_grad() = at::Tensor();
    for (auto& block : blocks) {
      for (auto& p : block->parameters()) {
        p.mutable_grad() = at::Tensor();
      }
    }
  }

  // One training step, each block checkpointed under its policy.
  void step(const std::vector<sac::Policy>& policies) {
    torch::manual_seed(7);
    at::Tensor h = x;
    for (GptBlock& block : blocks) {
      h = sac::checkpoint(sac::CheckpointOptions().policy(policies[&block - blocks.data()]),
                          [&block](const at::Tensor& in) { return block->forward(in); }, h);
    }
    h.sum().backward();
  }

  // The step's peak over what was live before it.
  int64_t measured_peak(const std::vector<sac::Policy>& policies) {
    zero_grad();
    const int64_t before = CountingAllocator::live_bytes();
    CountingAllocator::reset_peak();
    step(policies);
    return CountingAllocator::peak_bytes() - before;
  }

  std::vector<sac::RegionProfile> profiles() {
    std::vector<sac::RegionProfile> out;
    torch::manual_seed(7);
    at::Tensor h = x;
    for (auto& block : blocks) {
      const at::Tensor in = h;
      out.push_back(sac::profile([&] { h = block->forward(in); }, 1));
    }
    return out;
  }
};

sac::StepPhases measure_full_recomputation(Model& model) {
  const std::vector<sac::Policy> nothing(4, sac::nothing_saveable());
  model.step(nothing);  // warm-up: one-time allocations
  model.zero_grad();
  return sac::measure_step_phases(counting_probe(), [&] { model.step(nothing); });
}

// Exact on the CPU, where the counting allocator sees every byte: at each
// budget, the plan's predicted peak is the step's measured peak.
TEST_F(Peak, PredictedPeakIsTheMeasuredPeak) {
  Model model;
  const sac::StepPhases phases = measure_full_recomputation(model);
  EXPECT_EQ(phases.regions(), 4);
  // Each region's forward, the stretches between, the head, each backward.
  EXPECT_EQ(phases.phases().size(), 1u + 4 * 2 + 4);
  const auto profiles = model.profiles();
  std::vector<int64_t> peaks;
  for (int percent = 0; percent <= 100; percent += 10) {
    SCOPED_TRACE(percent);
    const auto plan = sac::budgeted_plan(profiles, sac::Budget::fraction(percent / 100.0));
    const int64_t predicted = phases.predict_peak(plan);
    EXPECT_EQ(predicted, model.measured_peak(plan.policies));
    peaks.push_back(predicted);
  }
  // Keeping more never lowers the peak here, and keeping everything raises it.
  EXPECT_EQ(peaks.front(), phases.peak());
  EXPECT_GT(peaks.back(), peaks.front());
}

// Plans for a sweep of peak budgets: never over the budget (measured),
// predicted exactly, and never recomputing more for more budget.
TEST_F(Peak, PlansForAPeakBudgetFitIt) {
  Model model;
  const sac::StepPhases phases = measure_full_recomputation(model);
  const auto profiles = model.profiles();
  const int64_t low = phases.peak();
  const int64_t high = phases.predict_peak(sac::budgeted_plan(profiles, sac::Budget::fraction(1)));
  double last_recompute = std::numeric_limits<double>::infinity();
  size_t exact = 0;
  for (int i = 0; i <= 8; ++i) {
    const int64_t budget = low + (high - low) * i / 8;
    SCOPED_TRACE(budget);
    const sac::PeakPlan plan = phases.plan_for_peak(profiles, budget);
    EXPECT_LE(plan.predicted_peak, budget);
    EXPECT_EQ(model.measured_peak(plan.plan.policies), plan.predicted_peak);
    EXPECT_LE(plan.plan.recompute_seconds, last_recompute);
    EXPECT_GE(plan.gap_seconds, 0);
    last_recompute = plan.plan.recompute_seconds;
    exact += plan.exact ? 1 : 0;
    std::cout << "budget " << budget << ": predicted " << plan.predicted_peak << ", recompute "
              << plan.plan.recompute_seconds * 1e3 << " ms, " << (plan.exact ? "exact" : "gap ")
              << (plan.exact ? 0.0 : plan.gap_seconds * 1e3) << ", " << plan.byte_budgets_tried
              << " byte budgets, " << plan.solver_seconds * 1e3 << " ms\n";
  }
  const std::string message =
      sac_test::error_of([&] { phases.plan_for_peak(profiles, low - 1); });
  EXPECT_NE(message.find("no plan of what to keep fits"), std::string::npos) << message;
}

// Sequence lengths that change step by step: one plan per length, solved
// when the length first appears, each step's peak under the budget and its
// gradients bit-identical to no checkpointing.
TEST_F(Peak, PlansFollowTheShapeOfTheData) {
  Model model;
  model.set_length(48);
  const sac::StepPhases longest = measure_full_recomputation(model);
  const int64_t everything =
      longest.predict_peak(sac::budgeted_plan(model.profiles(), sac::Budget::fraction(1)));
  const int64_t budget = (longest.peak() + everything) / 2;

  sac::ShapePlans plans([&](const sac::ShapePlans::Signature& shape) {
    model.set_length(shape[0]);
    const sac::StepPhases phases = measure_full_recomputation(model);
    return phases.plan_for_peak(model.profiles(), budget).plan.policies;
  });
  const std::vector<int64_t> lengths{16, 32, 24, 32, 48, 16, 48, 24, 40, 16};
  for (const int64_t length : lengths) {
    SCOPED_TRACE(length);
    const std::vector<sac::Policy>& policies = plans.policies_for({length});
    model.set_length(length);
    const auto expected = model.plain_gradients();
    EXPECT_LE(model.measured_peak(policies), budget);
    sac_test::expect_bit_identical(expected, model.gradients());
  }
  EXPECT_EQ(plans.solved(), 5u);  // 16, 32, 24, 48, 40
  // One static plan, the short batches', runs over the budget on the long.
  const std::vector<sac::Policy> short_plan = plans.policies_for({16});
  model.set_length(48);
  EXPECT_GT(model.measured_peak(short_plan), budget);
  for (const double seconds : plans.solve_seconds()) {
    std::cout << "solved a new length in " << seconds * 1e3 << " ms\n";
  }
}

TEST_F(Peak, APlanForOtherRegionsIsAClearError) {
  Model model;
  const sac::StepPhases phases = measure_full_recomputation(model);
  const auto profiles = model.profiles();
  const auto plan = sac::budgeted_plan({profiles[0], profiles[1]}, sac::Budget::fraction(0.5));
  const std::string message = sac_test::error_of([&] { phases.predict_peak(plan); });
  EXPECT_NE(message.find("ran 4 regions, but the plan has 2 policies"), std::string::npos)
      << message;
}

}  // namespace
