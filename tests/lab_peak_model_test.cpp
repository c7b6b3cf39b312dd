// The step's memory model (sac/lab/peak.h) on the shapes of model that broke
// its first version, one test per cause, and what it refuses. The generator
// (tests/fuzz/peak_models.cpp) checks the same properties on random models.
#include "tests/support.h"

#include <sac/sac.h>
#include <sac/policy/presets.h>
#include <sac/lab.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace {

using sac_test::counting_probe;
using sac_test::CountingAllocator;
using Body = std::function<at::Tensor(const at::Tensor&)>;

class PeakModel : public sac_test::CountingAllocatorTest {};

// Regions in a row (plain code between them is the caller's), each its own
// policy; a step is the forward, a loss and backward.
struct Regions {
  std::vector<Body> bodies;
  std::vector<at::Tensor> params;
  at::Tensor x;

  void zero_grad() {
    for (at::Tensor& p : params) {
      p.mutable_grad() = at::Tensor();
    }
    x.mutable_grad() = at::Tensor();
  }
  at::Tensor forward(const std::function<at::Tensor(size_t, const Body&, const at::Tensor&)>& run) {
    torch::manual_seed(7);
    at::Tensor h = x;
    for (size_t r = 0; r < bodies.size(); ++r) {
      h = run(r, bodies[r], h);
    }
    return h;
  }
  void step(const std::vector<sac::Policy>& policies) {
    at::Tensor out = forward([&](size_t r, const Body& body, const at::Tensor& in) {
      return sac::checkpoint(sac::CheckpointOptions().policy(policies[r]), body, in);
    });
    (out * out).mean().backward();
  }
  int64_t measured_peak(const std::vector<sac::Policy>& policies) {
    zero_grad();
    const int64_t before = CountingAllocator::live_bytes();
    CountingAllocator::reset_peak();
    step(policies);
    return CountingAllocator::peak_bytes() - before;
  }
  sac::StepPhases measure() {
    const std::vector<sac::Policy> nothing(bodies.size(), sac::nothing_saveable());
    step(nothing);  // one-time allocations
    zero_grad();
    return sac::measure_step_phases(counting_probe(), [&] { step(nothing); });
  }
  std::vector<sac::RegionProfile> profiles() {
    std::vector<sac::RegionProfile> out;
    forward([&](size_t, const Body& body, const at::Tensor& in) {
      at::Tensor y;
      out.push_back(sac::profile([&] { return y = body(in); }, 1));
      return y;
    });
    return out;
  }
  std::vector<std::vector<sac::SavedCall>> explained(const sac::Policy& policy) {
    std::vector<std::vector<sac::SavedCall>> kept;
    forward([&](size_t, const Body& body, const at::Tensor& in) {
      at::Tensor y;
      kept.push_back(sac::explain(policy, [&] { y = body(in); }).saved_calls());
      return y;
    });
    return kept;
  }
};

at::Tensor param(std::vector<int64_t> sizes) {
  return (torch::randn(sizes) * 0.1).set_requires_grad(true);
}

// Every preset predicted to the byte, every byte plan too, and peak plans
// within their budgets, predicted to the byte.
void expect_exact(Regions& model) {
  const sac::StepPhases phases = model.measure();
  const size_t n = model.bodies.size();
  for (const auto& policy :
       {sac::nothing_saveable(), sac::everything_saveable(), sac::dots_saveable(),
        sac::compute_intensive_ops(), sac::outputs_larger_than(4096)}) {
    SCOPED_TRACE(policy.describe());
    EXPECT_EQ(phases.predict_peak(model.explained(policy)),
              model.measured_peak(std::vector<sac::Policy>(n, policy)));
  }
  const auto profiles = model.profiles();
  for (const double fraction : {0.25, 0.5, 1.0}) {
    SCOPED_TRACE(fraction);
    const auto plan = sac::budgeted_plan(profiles, sac::Budget::of_everything_saveable(fraction),
                                         std::nullopt, false);
    EXPECT_EQ(phases.predict_peak(plan), model.measured_peak(plan.policies));
  }
  const int64_t low = phases.peak();
  const int64_t high = phases.predict_peak(
      sac::budgeted_plan(profiles, sac::Budget::of_everything_saveable(1), std::nullopt, false));
  for (int i = 0; i <= 4; ++i) {
    const int64_t budget = low + (high - low) * i / 4;
    SCOPED_TRACE(budget);
    const sac::PeakPlan plan = phases.plan_for_peak(profiles, budget);
    const int64_t measured = model.measured_peak(plan.plan.policies);
    EXPECT_EQ(plan.predicted_peak, measured);
    EXPECT_LE(measured, budget);
  }
}

// A CNN: conv, BatchNorm then ReLU (ReLU saves its output, not BatchNorm's,
// so a kept BatchNorm output is one autograd does not save), pooling.
TEST_F(PeakModel, ACnnWithBatchNormThenRelu) {
  torch::manual_seed(0);
  Regions model;
  for (int r = 0; r < 3; ++r) {
    at::Tensor w = param({8, 8, 3, 3}), b = param({8}), g = param({8}), beta = param({8});
    at::Tensor mean = torch::zeros({8}), var = torch::ones({8});
    model.params.insert(model.params.end(), {w, b, g, beta});
    model.bodies.push_back([=](const at::Tensor& h) {
      at::Tensor y = at::conv2d(h, w, b, 1, 1);
      y = at::relu(at::batch_norm(y, g, beta, mean, var, true, 0.1, 1e-5, false));
      return at::max_pool2d(y, {3, 3}, {1, 1}, {1, 1});
    });
  }
  model.x = torch::randn({2, 8, 12, 12}, torch::requires_grad());
  expect_exact(model);
}

// A transformer block whose causal mask is built in the forward, with
// attention written out (a scale, the mask, softmax, dropout).
TEST_F(PeakModel, ATransformerWithAMaskBuiltInTheForward) {
  torch::manual_seed(0);
  Regions model;
  const int64_t d = 32;
  for (int r = 0; r < 2; ++r) {
    at::Tensor qkv = param({3 * d, d}), proj = param({d, d}), fc = param({4 * d, d}),
               out = param({d, 4 * d});
    model.params.insert(model.params.end(), {qkv, proj, fc, out});
    model.bodies.push_back([=](const at::Tensor& h) {
      const int64_t T = h.size(1);
      auto parts = at::linear(at::layer_norm(h, {d}), qkv).split(d, 2);
      at::Tensor mask = torch::ones({T, T}, torch::kBool).tril().logical_not();
      at::Tensor scores = at::matmul(parts[0], parts[1].transpose(1, 2)) / 4.0;
      at::Tensor att = at::dropout(at::softmax(scores.masked_fill(mask, -1e9), -1), 0.1, true);
      at::Tensor a = h + at::linear(at::matmul(att, parts[2]), proj);
      return a + at::linear(at::gelu(at::linear(a, fc)), out);
    });
  }
  model.x = torch::randn({2, 24, d}, torch::requires_grad());
  expect_exact(model);
}

// A chain of scalings (outputs nothing saves) before a large head.
TEST_F(PeakModel, AChainOfScalingsBeforeALargeHead) {
  torch::manual_seed(0);
  Regions model;
  at::Tensor head = param({1024, 64});
  model.params.push_back(head);
  model.bodies.push_back([](const at::Tensor& h) { return ((h * 2.0) / 3.0 + 1.0) * 0.5; });
  model.bodies.push_back([head](const at::Tensor& h) { return at::tanh(at::linear(h, head)); });
  model.x = torch::randn({64, 64}, torch::requires_grad());
  expect_exact(model);
}

// A region whose forward saves nothing that autograd needs is never
// recomputed: what it keeps goes with its frame, at once (the first model
// held it to the step's end).
TEST_F(PeakModel, ARegionNeverRecomputedReleasesWhatItKept) {
  torch::manual_seed(0);
  Regions model;
  model.bodies.push_back([](const at::Tensor& h) { return (h * 2.0 + 1.0) * 3.0; });
  model.bodies.push_back([](const at::Tensor& h) { return at::tanh(h); });
  model.x = torch::randn({128, 128}, torch::requires_grad());
  const sac::StepPhases phases = model.measure();
  const auto kept = model.explained(sac::everything_saveable());
  EXPECT_FALSE(kept[0].empty());
  EXPECT_EQ(phases.predict_peak(kept),
            model.measured_peak({sac::everything_saveable(), sac::everything_saveable()}));
}

// A bias added in place to a matmul's output (as LibTorch's linear does
// where it cannot fuse it): a kept call demoted at the forward's end, which
// held its storage until then (the first model left such calls out).
TEST_F(PeakModel, DemotedCallsHoldTheirStorageThroughTheForward) {
  torch::manual_seed(0);
  Regions model;
  at::Tensor w = param({256, 64}), b = param({256}), w2 = param({64, 256});
  model.params = {w, b, w2};
  model.bodies.push_back([=](const at::Tensor& h) {
    at::Tensor y = at::matmul(h, w.t());
    y.add_(b);
    return at::linear(at::relu(y), w2);
  });
  model.x = torch::randn({2, 32, 64}, torch::requires_grad());
  const sac::StepPhases phases = model.measure();
  const auto kept = model.explained(sac::everything_saveable());
  bool demoted = false;
  for (const auto& k : kept[0]) {
    demoted = demoted || k.demoted;
  }
  EXPECT_TRUE(demoted) << "the matmul under the bias's add_";
  EXPECT_EQ(phases.predict_peak(kept), model.measured_peak({sac::everything_saveable()}));
}

// On an accelerator the events are the caching allocator's blocks, which
// CUDA's rounds up to multiples of 512 bytes: the prediction is of those
// allocated bytes (not of the segments it reserves). The counting allocator,
// rounding the same way, stands in for it.
TEST_F(PeakModel, BlocksRoundedAsCudasAreWhatIsPredicted) {
  struct Exact {
    ~Exact() { CountingAllocator::round_to(1); }
  } exact_again;
  CountingAllocator::round_to(512);
  torch::manual_seed(0);
  Regions model;
  const int64_t d = 12;  // rows of 48 bytes: nearly every block rounds
  for (int r = 0; r < 2; ++r) {
    at::Tensor w = param({d, d}), b = param({d});
    model.params.insert(model.params.end(), {w, b});
    model.bodies.push_back([=](const at::Tensor& h) {
      return at::gelu(at::linear(at::layer_norm(h, {d}), w, b)) * 0.5 + h;
    });
  }
  model.x = torch::randn({3, 5, d}, torch::requires_grad());
  expect_exact(model);
}

// A measured step must keep nothing: the prediction adds what a plan keeps.
TEST_F(PeakModel, MeasuringAStepThatKeepsIsAnError) {
  Regions model;
  model.bodies.push_back([](const at::Tensor& h) { return at::tanh(h * 2.0); });
  model.x = torch::randn({16, 16}, torch::requires_grad());
  const std::string message = sac_test::error_of([&] {
    sac::measure_step_phases(counting_probe(), [&] { model.step({sac::everything_saveable()}); });
  });
  EXPECT_NE(message.find("kept the outputs of 2 op calls under its policy"), std::string::npos)
      << message;
}

// What the model does not cover is refused: nested regions, and a plan that
// keeps a view of a call it recomputes.
TEST_F(PeakModel, WhatTheModelDoesNotCoverIsRefused) {
  const at::Tensor x = torch::randn({8, 8}, torch::requires_grad());
  std::string message = sac_test::error_of([&] {
    sac::measure_step_phases(counting_probe(), [&] {
      at::Tensor y = sac::checkpoint(
          [](const at::Tensor& h) {
            return sac::checkpoint([](const at::Tensor& i) { return at::tanh(i); }, h) * 2.0;
          },
          x);
      y.sum().backward();
    });
  });
  EXPECT_NE(message.find("nested regions are not covered"), std::string::npos) << message;

  // Several intra-op threads: their scratch buffers go unreported.
  const sac::MemoryProbe probe = counting_probe();  // which sets one thread
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  message = sac_test::error_of([&] {
    sac::measure_step_phases(probe, [&] {
      sac::checkpoint([](const at::Tensor& h) { return at::tanh(h); }, x).sum().backward();
    });
  });
  at::set_num_threads(threads);
  EXPECT_NE(message.find("intra-op threads"), std::string::npos) << message;

  torch::manual_seed(0);
  Regions model;
  at::Tensor w = param({64, 32});
  model.params = {w};
  model.bodies.push_back([w](const at::Tensor& h) { return at::tanh(at::matmul(h, w.t())); });
  model.x = torch::randn({2, 16, 32}, torch::requires_grad());
  const sac::StepPhases phases = model.measure();
  message = sac_test::error_of(
      [&] { phases.predict_peak(model.explained(sac::Policy::save_ops({"aten::_unsafe_view"}))); });
  EXPECT_NE(message.find("lies on the storage of an earlier call that the plan recomputes"),
            std::string::npos)
      << message;
}

// The counting allocator's reports are what the step is recorded from; an
// allocator whose peak the reports do not reach is refused.
TEST_F(PeakModel, AProbeTheReportsDisagreeWithIsRefused) {
  Regions model;
  model.bodies.push_back([](const at::Tensor& h) { return at::tanh(h); });
  model.x = torch::randn({16, 16}, torch::requires_grad());
  sac::MemoryProbe lying = counting_probe();
  lying.peak = [] { return CountingAllocator::peak_bytes() + 1; };
  const std::string message = sac_test::error_of(
      [&] { sac::measure_step_phases(lying, [&] { model.step({sac::nothing_saveable()}); }); });
  EXPECT_NE(message.find("does not report every allocation"), std::string::npos) << message;
}

}  // namespace
