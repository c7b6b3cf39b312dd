// A training step's peak under a plan, predicted from one step under full
// recomputation (sac/lab/peak.h), against the peak the counting allocator
// measures for the step under that plan.
#include "tests/support.h"

#include <sac/sac.h>
#include <sac/policy/presets.h>
#include <sac/lab.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <c10/core/CachingDeviceAllocator.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

namespace {

using sac_test::counting_probe;
using sac_test::CountingAllocator;
using sac_test::GptBlock;

class Peak : public sac_test::CountingAllocatorTest {};

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
      h = sac::checkpoint(
          sac::CheckpointOptions().policy(policies[&block - blocks.data()]),
          [&block](const at::Tensor& in) { return block->forward(in); }, h);
    }
    h.sum().backward();
  }

  // The peak of a step in the usual loop (gradients set to none first, the
  // last step's there before it, and left at the end) over what was live
  // before it.
  int64_t loop_peak(const std::vector<sac::Policy>& policies) {
    auto fill = [](at::Tensor p) {
      if (!p.grad().defined()) {
        p.mutable_grad() = at::zeros_like(p);
      }
    };
    fill(x);
    for (auto& block : blocks) {
      for (auto& p : block->parameters()) {
        fill(p);
      }
    }
    const int64_t before = CountingAllocator::live_bytes();
    CountingAllocator::reset_peak();
    zero_grad();
    step(policies);
    return CountingAllocator::peak_bytes() - before;
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
      out.push_back(sac::profile([&] { return h = block->forward(in); }, 1));
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
    const auto plan = sac::budgeted_plan(
        profiles, sac::Budget::of_everything_saveable(percent / 100.0), std::nullopt, false);
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
  const int64_t high = phases.predict_peak(
      sac::budgeted_plan(profiles, sac::Budget::of_everything_saveable(1), std::nullopt, false));
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
  const std::string message = sac_test::error_of([&] { phases.plan_for_peak(profiles, low - 1); });
  EXPECT_NE(message.find("no plan of what to keep fits"), std::string::npos) << message;
}

// Not checkpointing is a plan too, predicted (Note [A region left unchecked]
// in sac/lab/plan_trace.cpp): the step is measured once, in the usual loop that
// sets its gradients to none first and leaves them at the end, and is never
// run plainly. The plain step's peak, and the peaks of plans that leave some
// regions unchecked and checkpoint others, are the measured ones. A peak
// budget the plain step fits gets the plan that checkpoints nothing, which
// recomputes nothing; under it, every plan that fits peaks lower.
TEST_F(Peak, APeakBudgetThePlainStepFitsRecomputesNothing) {
  Model model;
  const std::vector<sac::Policy> nothing(4, sac::nothing_saveable());
  model.step(nothing);  // warm-up: one-time allocations; its gradients stay
  const sac::StepPhases phases = sac::measure_step_phases(counting_probe(), [&] {
    model.zero_grad();
    model.step(nothing);
  });
  EXPECT_EQ(phases.left(), 0);  // the gradients it freed first, made again
  ASSERT_TRUE(phases.plain_peak().has_value()) << phases.why_no_plain_peak();
  const int64_t plain = *phases.plain_peak();
  const auto profiles = model.profiles();
  const sac::BudgetedPlan unchecked = sac::budgeted_plan(profiles, sac::Budget::fraction(1));
  ASSERT_EQ(std::count(unchecked.checkpointed.begin(), unchecked.checkpointed.end(), true), 0);
  EXPECT_EQ(phases.predict_peak(unchecked), plain);
  EXPECT_EQ(model.loop_peak(unchecked.policies), plain);
  // Plans that mix unchecked and checkpointed regions, predicted alike.
  size_t mixed = 0;
  for (int tenths = 1; tenths < 10; ++tenths) {
    SCOPED_TRACE(tenths);
    const sac::BudgetedPlan plan =
        sac::budgeted_plan(profiles, sac::Budget::fraction(tenths / 10.0));
    const auto checkpointed = std::count(plan.checkpointed.begin(), plan.checkpointed.end(), true);
    mixed += checkpointed > 0 && checkpointed < 4 ? 1 : 0;
    EXPECT_EQ(model.loop_peak(plan.policies), phases.predict_peak(plan));
  }
  EXPECT_GT(mixed, 0U);
  const int64_t low = phases.peak();
  const int64_t high = phases.predict_peak(
      sac::budgeted_plan(profiles, sac::Budget::of_everything_saveable(1), std::nullopt, false));
  // Full recomputation peaks lower than the plain step, which peaks lower
  // than keeping every call: the budgets between are the ones in question.
  std::cout << "peaks: full recomputation " << low << ", plain " << plain << ", every call kept "
            << high << " bytes\n";
  ASSERT_LT(low, plain);
  ASSERT_LT(plain, high);
  std::vector<int64_t> budgets;
  for (int i = 0; i <= 8; ++i) {
    budgets.push_back(low + (high - low) * i / 8);
  }
  budgets.push_back(plain - 1);
  budgets.push_back(plain);
  for (const int64_t budget : budgets) {
    SCOPED_TRACE(budget);
    const sac::PeakPlan plan = phases.plan_for_peak(profiles, budget);
    const int64_t measured = model.loop_peak(plan.plan.policies);
    EXPECT_EQ(measured, plan.predicted_peak);
    EXPECT_LE(measured, budget);
    const bool checkpoints_any =
        std::count(plan.plan.checkpointed.begin(), plan.plan.checkpointed.end(), true) > 0;
    if (budget >= plain) {
      EXPECT_FALSE(checkpoints_any);
      EXPECT_EQ(plan.plan.recompute_seconds, 0);
      EXPECT_EQ(plan.predicted_peak, plain);
      EXPECT_TRUE(plan.exact);
    } else {
      EXPECT_TRUE(checkpoints_any);
      EXPECT_LT(measured, plain);
    }
  }
  // Without a plain peak (another rank had none), the same budget checkpoints.
  const sac::StepPhases none = phases.with_plain_peak(std::nullopt, "rank 1 had none");
  EXPECT_EQ(none.why_no_plain_peak(), "rank 1 had none");
  EXPECT_TRUE(none.plan_for_peak(profiles, plain).plan.checkpointed[0]);
}

// sac hears the step's memory itself, from c10's memory reports: measured
// with no probe, the step and every plan's prediction are the probe's, and
// sac::measure_peak of a step under a plan is the allocator's peak.
TEST_F(Peak, SacMeasuresTheStepsMemoryItself) {
  Model model;
  const std::vector<sac::Policy> nothing(4, sac::nothing_saveable());
  model.step(nothing);  // warm-up: one-time allocations
  model.zero_grad();
  const sac::StepPhases probed = sac::measure_step_phases(counting_probe(), [&] {
    model.step(nothing);
    model.zero_grad();
  });
  const sac::StepPhases heard = sac::measure_step_phases([&] {
    model.step(nothing);
    model.zero_grad();
  });
  EXPECT_EQ(heard.peak(), probed.peak());
  EXPECT_EQ(heard.events(), probed.events());
  const auto profiles = model.profiles();
  for (const int64_t budget : {heard.peak(), heard.peak() + (1 << 16), int64_t{1} << 30}) {
    SCOPED_TRACE(budget);
    const sac::PeakPlan plan = heard.plan_for_peak(profiles, budget);
    EXPECT_EQ(plan.predicted_peak, probed.plan_for_peak(profiles, budget).predicted_peak);
    const int64_t measured = model.measured_peak(plan.plan.policies);
    model.zero_grad();
    EXPECT_EQ(sac::measure_peak([&] { model.step(plan.plan.policies); }), measured);
    EXPECT_EQ(measured, plan.predicted_peak);
  }
  // Its own errors name it.
  at::set_num_threads(2);
  const std::string threads = sac_test::error_of([&] { sac::measure_peak([] {}); });
  at::set_num_threads(1);
  EXPECT_NE(threads.find("sac::measure_peak: the CPU runs ops on 2 intra-op threads"),
            std::string::npos)
      << threads;
}

// A step that ran no region has nothing to plan: an error, not an empty plan.
TEST_F(Peak, AStepWithoutRegionsIsRefused) {
  Model model;
  const std::string message = sac_test::error_of([&] {
    sac::measure_step_phases(counting_probe(), [&] {
      model.zero_grad();
      model.plain_gradients();
    });
  });
  EXPECT_NE(message.find("the step ran no sac region"), std::string::npos) << message;
}

// Offload as a choice of the peak plan, through the profile's seam: the
// same profiles, said to be on an accelerator, with trips that cost a tenth
// of every call's recomputation. At full recomputation's peak, where nothing
// can be kept, the plan offloads instead of recomputing; its peak is
// unchanged (an offloaded output holds no device memory) and it costs less.
TEST_F(Peak, APeakPlanOffloadsWhereTheTripIsCheaper) {
  Model model;
  const sac::StepPhases phases = measure_full_recomputation(model);
  std::vector<sac::RegionProfile> on_device;
  double fastest = std::numeric_limits<double>::max();
  for (const auto& profile : model.profiles()) {
    std::vector<sac::OpCallProfile> calls = profile.calls();
    for (auto& call : calls) {
      call.device = c10::Device(c10::kCUDA, 0);
      if (call.output_bytes > 0) {
        fastest = std::min(fastest, call.seconds / static_cast<double>(call.output_bytes));
      }
    }
    on_device.emplace_back(std::move(calls));
  }
  const sac::OffloadCost cheap{10.0 / fastest};  // bytes per second
  const sac::PeakPlan recomputing = phases.plan_for_peak(on_device, phases.peak());
  const sac::PeakPlan offloading = phases.plan_for_peak(on_device, phases.peak(), cheap);
  EXPECT_EQ(recomputing.plan.offloaded_bytes, 0);
  EXPECT_GT(offloading.plan.offloaded_bytes, 0);
  EXPECT_EQ(offloading.predicted_peak, phases.peak());
  EXPECT_LT(offloading.plan.recompute_seconds + offloading.plan.offload_seconds,
            recomputing.plan.recompute_seconds);
  EXPECT_GE(offloading.gap_seconds, 0);
}

// Sequence lengths that change step by step: one plan per length, solved
// when the length first appears under the peak budget `budget()` reads then,
// each step's peak under `limit` and its gradients bit-identical to no
// checkpointing.
void follow_changing_lengths(Model& model, const std::function<int64_t()>& budget,
                             const std::function<int64_t()>& limit) {
  sac::ShapePlans plans([&](const sac::ShapePlans::Signature& shape) {
    model.set_length(shape[0]);
    model.zero_grad();
    const int64_t bytes = budget();  // as the step begins
    const sac::StepPhases phases = measure_full_recomputation(model);
    return phases.plan_for_peak(model.profiles(), bytes).plan.policies;
  });
  const std::vector<int64_t> lengths{16, 32, 24, 32, 48, 16, 48, 24, 40, 16};
  for (const int64_t length : lengths) {
    SCOPED_TRACE(length);
    const std::vector<sac::Policy>& policies = plans.policies_for({length});
    model.set_length(length);
    model.zero_grad();
    const int64_t room = limit();  // as the step begins
    EXPECT_LE(model.measured_peak(policies), room);
    const auto got = model.gradients();
    sac_test::expect_bit_identical(model.plain_gradients(), got);
  }
  EXPECT_EQ(plans.solved(), 5u);  // 16, 32, 24, 48, 40
  // One static plan, the short batches', runs over the limit on the long.
  const std::vector<sac::Policy> short_plan = plans.policies_for({16});
  model.set_length(48);
  model.zero_grad();
  const int64_t room = limit();
  EXPECT_GT(model.measured_peak(short_plan), room);
  for (const double seconds : plans.solve_seconds()) {
    std::cout << "solved a new length in " << seconds * 1e3 << " ms\n";
  }
}

// The midpoint of the longest length's peaks, full recomputation's and
// keeping everything's: a budget that leaves a choice.
int64_t mid_budget(Model& model) {
  model.set_length(48);
  const sac::StepPhases longest = measure_full_recomputation(model);
  const int64_t everything = longest.predict_peak(sac::budgeted_plan(
      model.profiles(), sac::Budget::of_everything_saveable(1), std::nullopt, false));
  return (longest.peak() + everything) / 2;
}

TEST_F(Peak, PlansFollowTheShapeOfTheData) {
  Model model;
  const int64_t budget = mid_budget(model);
  follow_changing_lengths(
      model, [&] { return budget; }, [&] { return budget; });
}

// The same with the budget read from free memory at each solve: a device of
// `capacity` bytes, where what is live before the step counts against it.
TEST_F(Peak, PlansFollowTheFreeMemory) {
  Model model;
  const int64_t budget = mid_budget(model);
  model.zero_grad();
  const int64_t capacity = CountingAllocator::live_bytes() + budget;
  sac::MemoryProbe probe = counting_probe();
  probe.free = [&] { return capacity - CountingAllocator::live_bytes(); };
  // measured_peak counts over what is live as the step begins: its limit
  // is what is free then.
  follow_changing_lengths(model, probe.free, probe.free);
}

// A fake caching allocator behind the accelerator's seam (PrivateUse1), with
// statistics set by the test: what sac::device_memory_probe reads from it.
class StatisticsAllocator final : public c10::DeviceAllocator {
 public:
  int64_t allocated = 0, peak = 0, reserved = 0, device_free = 0;
  std::vector<c10::DeviceIndex> peaks_reset;
  c10::DeviceIndex asked = -1;

  c10::DataPtr allocate(size_t) override { return {nullptr, c10::Device(c10::kPrivateUse1, 0)}; }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void*, const void*, std::size_t) const override {}
  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override {}
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex index) override {
    asked = index;
    c10::CachingDeviceAllocator::DeviceStats stats;
    constexpr size_t kAll = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    stats.allocated_bytes[kAll].current = allocated;
    stats.allocated_bytes[kAll].peak = peak;
    stats.reserved_bytes[kAll].current = reserved;
    return stats;
  }
  void resetAccumulatedStats(c10::DeviceIndex) override {}
  void resetPeakStats(c10::DeviceIndex index) override { peaks_reset.push_back(index); }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex) override {
    return {static_cast<size_t>(device_free), size_t{1} << 40};
  }
};

TEST_F(Peak, TheDeviceProbeReadsTheCachingAllocator) {
  static StatisticsAllocator fake;
  c10::SetAllocator(c10::kPrivateUse1, &fake);
  fake.allocated = 1000;
  fake.peak = 5000;
  fake.reserved = 3000;
  fake.device_free = 10000;
  const sac::MemoryProbe probe = sac::device_memory_probe(c10::Device(c10::kPrivateUse1, 1));
  EXPECT_EQ(probe.live(), 1000);
  EXPECT_EQ(fake.asked, 1);
  EXPECT_EQ(probe.peak(), 5000);
  EXPECT_EQ(probe.free(), 10000 + 2000) << "the device's free memory and the cache's unused";
  probe.reset_peak();
  EXPECT_EQ(fake.peaks_reset, std::vector<c10::DeviceIndex>{1});

  std::string message = sac_test::error_of([] { sac::device_memory_probe(c10::kCPU); });
  EXPECT_NE(message.find("the CPU has no caching device allocator"), std::string::npos) << message;
  message = sac_test::error_of([] { sac::device_memory_probe(c10::Device(c10::kIPU, 0)); });
  EXPECT_NE(message.find("has no caching device allocator (none is registered"), std::string::npos)
      << message;
}

TEST_F(Peak, APlanForOtherRegionsIsAClearError) {
  Model model;
  const sac::StepPhases phases = measure_full_recomputation(model);
  const auto profiles = model.profiles();
  const auto plan = sac::budgeted_plan(
      {profiles[0], profiles[1]}, sac::Budget::of_everything_saveable(0.5), std::nullopt, false);
  const std::string message = sac_test::error_of([&] { phases.predict_peak(plan); });
  EXPECT_NE(message.find("ran 4 regions, but the plan has 2 policies"), std::string::npos)
      << message;
}

// Note [The step's memory shares the profiler's slot] (step_trace.cpp): c10 reports
// allocations to the one profiler state of the thread, so a profiler and
// the step's recording cannot both run. Either order is refused with sac's
// error (before the slot was shared, an abort: a mutex read in the
// recorder's memory), and the profilers work before and after.
namespace profilers {

using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

void start_kineto() {
  const ProfilerConfig config(ProfilerState::KINETO, false, /*profile_memory=*/true);
  torch::autograd::profiler::prepareProfiler(config, {ActivityType::CPU});
  torch::autograd::profiler::enableProfiler(config, {ActivityType::CPU});
}

void stop_kineto() { torch::autograd::profiler::disableProfiler(); }

void start_legacy() {
  torch::autograd::profiler::enableProfilerLegacy(
      ProfilerConfig(ProfilerState::CPU, false, /*profile_memory=*/true));
}

void stop_legacy() { torch::autograd::profiler::disableProfilerLegacy(); }

}  // namespace profilers

TEST_F(Peak, AProfilerRunningWhenTheStepBeginsIsRefused) {
  Model model;
  const std::vector<sac::Policy> nothing(4, sac::nothing_saveable());
  model.step(nothing);
  for (const auto& [start, stop] : {std::pair{&profilers::start_kineto, &profilers::stop_kineto},
                                    std::pair{&profilers::start_legacy, &profilers::stop_legacy}}) {
    start();
    const std::string message = sac_test::error_of(
        [&] { sac::measure_step_phases(counting_probe(), [&] { model.step(nothing); }); });
    stop();
    EXPECT_NE(message.find("sac::measure_step_phases: a profiler is active on this thread"),
              std::string::npos)
        << message;
  }
  // Measured without one, then profiled: both as if the other never ran.
  EXPECT_NO_THROW(measure_full_recomputation(model));
  profilers::start_kineto();
  model.step(nothing);
  EXPECT_NO_THROW(profilers::stop_kineto());
}

TEST_F(Peak, AProfilerStartedInsideTheStepIsRefused) {
  Model model;
  const std::vector<sac::Policy> nothing(4, sac::nothing_saveable());
  model.step(nothing);
  // Each profiler finds the recorder's (disabled) state in its slot and
  // refuses to start; sac says why.
  for (const auto start : {&profilers::start_kineto, &profilers::start_legacy}) {
    model.zero_grad();
    const std::string message = sac_test::error_of([&] {
      sac::measure_step_phases(counting_probe(), [&] {
        start();
        model.step(nothing);
      });
    });
    EXPECT_NE(message.find("Profiler is already enabled on this thread"), std::string::npos)
        << message;
    EXPECT_NE(message.find("sac::measure_step_phases: the step started a profiler"),
              std::string::npos)
        << message;
  }
  EXPECT_NO_THROW(measure_full_recomputation(model));
  profilers::start_legacy();
  model.step(nothing);
  EXPECT_NO_THROW(profilers::stop_legacy());
}

}  // namespace
