// DeterminismCheck::Values: a recomputation that reads different values than
// its forward is an error that names the op, not silently wrong gradients.
// The CPU is deterministic, so each test injects the difference: a write
// through data_ptr() behind autograd's back between forward and backward, a
// custom op that draws from its own state, and a router whose scores move by
// 2e-4 in recomputation, as a nondeterministic kernel's might, so that its
// top-k flips. Each first runs under the default check (shapes, dtypes and
// devices), which passes, with wrong gradients: what the value check is for.
// Under sac::checkpoint, the region guard (fallback key) and the nn wrappers.
#include "tests/support.h"

#include <sac/check/internal/checksum.h>
#include <sac/dispatch/internal/interceptor.h>
#include <sac/nn/apply_activation_checkpointing.h>
#include <sac/nn/checkpoint_wrapper.h>
#include <sac/sac.h>
#include <sac/policy/presets.h>
#include <sac/checkpoint/guards.h>

#include <gtest/gtest.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <atomic>
#include <algorithm>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

namespace {

using sac::DeterminismCheck;
using sac_test::error_of;

// A scale that grows with every call: an op with state of its own.
std::atomic<int> drift_calls{0};
at::Tensor drift(const at::Tensor& x) { return at::full_like(x, 1.0 + 0.25 * drift_calls++); }

// The router's scores as given on the first call; on later calls column 1
// raised by 2e-4.
std::atomic<int> jitter_calls{0};

// Host data that changes with every call: torch::tensor of a new vector.
std::atomic<int> host_calls{0};
at::Tensor host_scale(int64_t n) {
  return torch::tensor(std::vector<float>(n, 1.0f + 0.25f * host_calls++));
}
at::Tensor jitter(const at::Tensor& x) {
  at::Tensor y = x.clone();
  if (jitter_calls++ > 0) {
    y.select(1, 1).add_(2e-4);
  }
  return y;
}

TORCH_LIBRARY(sac_values_test, m) {
  m.def("drift(Tensor x) -> Tensor");
  m.def("jitter(Tensor x) -> Tensor");
}
TORCH_LIBRARY_IMPL(sac_values_test, CPU, m) {
  m.impl("drift", drift);
  m.impl("jitter", jitter);
}

at::Tensor call(const char* op, const at::Tensor& x) {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow(op, "")
      .typed<at::Tensor(const at::Tensor&)>()
      .call(x);
}

using Program = std::function<at::Tensor(const at::Tensor&)>;

// A module that runs a program: what the wrappers wrap.
struct ProgramModuleImpl : torch::nn::Module {
  explicit ProgramModuleImpl(Program program) : program(std::move(program)) {}
  at::Tensor forward(const at::Tensor& x) { return program(x); }
  Program program;
};
TORCH_MODULE(ProgramModule);

enum class Entry { Function, Region, Wrapper, Applied };

std::string name_of(Entry entry) {
  switch (entry) {
    case Entry::Function: return "sac::checkpoint";
    case Entry::Region: return "sac::CheckpointRegion";
    case Entry::Wrapper: return "sac::checkpoint_wrapper";
    case Entry::Applied: return "sac::apply_activation_checkpointing";
  }
  return "?";
}

// The entry points this mechanism runs (the region guard needs the
// fallback key).
std::vector<Entry> entries() {
  sac_test::expect_configured_mechanism();
  std::vector<Entry> out{Entry::Function, Entry::Wrapper, Entry::Applied};
  if (sac::detail::observers_see_every_op()) {
    out.push_back(Entry::Region);
  }
  return out;
}

// What a checkpointed run gave: the gradients, or the error of its backward.
struct Outcome {
  std::vector<at::Tensor> grads;
  std::string error;
};

// A program run plain or checkpointed, each time from the custom ops' first
// call: the gradients of sum(program(x)) with respect to `wrt`. `between`
// runs after the checkpointed forward.
class ProgramRuns {
 public:
  ProgramRuns(Program program, std::vector<at::Tensor> wrt)
      : program_(std::move(program)), wrt_(std::move(wrt)) {}

  // Without checkpointing.
  std::vector<at::Tensor> plain(const at::Tensor& x) const {
    reset();
    return torch::autograd::grad({program_(x).sum()}, wrt_);
  }

  Outcome checkpointed(
      Entry entry, const sac::CheckpointOptions& options, const at::Tensor& x,
      const std::function<void()>& between = [] {}) const {
    reset();
    const at::Tensor y = forward(entry, options, x);
    between();
    try {
      return {torch::autograd::grad({y.sum()}, wrt_), ""};
    } catch (const c10::Error& e) {
      return {{}, e.what_without_backtrace()};
    }
  }

 private:
  static void reset() {
    drift_calls = 0;
    jitter_calls = 0;
    host_calls = 0;
  }

  at::Tensor forward(Entry entry, const sac::CheckpointOptions& options,
                     const at::Tensor& x) const {
    switch (entry) {
      case Entry::Function: return sac::checkpoint(options, program_, x);
      case Entry::Region: {
        sac::CheckpointRegion region(options);
        return program_(x);
      }
      case Entry::Wrapper:
        return sac::checkpoint_wrapper(ProgramModule(program_), options)->forward(x);
      case Entry::Applied: {
        torch::nn::Sequential model{torch::nn::Identity(), ProgramModule(program_)};
        EXPECT_EQ(sac::apply_activation_checkpointing(
                      model.ptr(),
                      [](const std::string& name, const torch::nn::Module&) { return name == "1"; },
                      options),
                  1);
        return model->forward(x);
      }
    }
    return {};
  }

  Program program_;
  std::vector<at::Tensor> wrt_;
};

// What the default check lets through: no error, and gradients that differ
// from the reference (printed: by how much).
void expect_silently_wrong(const std::vector<at::Tensor>& expected, const Outcome& unchecked) {
  EXPECT_TRUE(unchecked.error.empty()) << unchecked.error;
  double most = 0;
  const bool compared = unchecked.grads.size() == expected.size();
  for (size_t i = 0; compared && i < expected.size(); ++i) {
    most = std::max(most, (expected[i] - unchecked.grads[i]).abs().max().item<double>());
  }
  std::cout << "  without the value check: no error, gradients off by up to " << most << "\n";
  EXPECT_TRUE(!compared || most > 0) << "silently wrong without the value check";
}

sac::CheckpointOptions with_check(DeterminismCheck check) {
  return sac::CheckpointOptions().determinism_check(check);
}

// Runs `entry` without the value check (expects silently wrong gradients)
// and then with it; returns the second run, whose error the test reads.
// `between` runs between forward and backward, `after` after each run.
Outcome only_the_value_check_catches(
    const ProgramRuns& run, Entry entry, const at::Tensor& x,
    const std::vector<at::Tensor>& expected, const std::function<void()>& between = [] {},
    const std::function<void()>& after = [] {}) {
  const Outcome unchecked =
      run.checkpointed(entry, with_check(DeterminismCheck::Default), x, between);
  after();
  expect_silently_wrong(expected, unchecked);
  Outcome checked = run.checkpointed(entry, with_check(DeterminismCheck::Values), x, between);
  after();
  return checked;
}

void expect_contains(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "expected \"" << part << "\" in:\n"
                                                   << message;
}

class ValueCheck : public ::testing::TestWithParam<bool> {
 protected:
  // The parameter: checksums by tensor ops, the accelerators' path, on the
  // CPU (the seam).
  void SetUp() override { sac::detail::checksum_with_tensor_ops_for_testing(GetParam()); }
  void TearDown() override { sac::detail::checksum_with_tensor_ops_for_testing(false); }
};

TEST_P(ValueCheck, AWriteThroughDataPtrBehindAutogradIsNamed) {
  torch::manual_seed(0);
  const at::Tensor w = torch::randn({16, 16}, torch::requires_grad());
  const at::Tensor scale = torch::rand({16}) + 0.5;  // a buffer
  const at::Tensor x = torch::randn({8, 16}, torch::requires_grad());
  const ProgramRuns run([&](const at::Tensor& in) { return in.mm(w).tanh() * scale; }, {x, w});
  const auto expected = run.plain(x);
  // Behind autograd's back: the version counter does not move.
  auto write = [&] { scale.data_ptr<float>()[3] += 1.0f; };
  auto undo = [&] { scale.data_ptr<float>()[3] -= 1.0f; };
  for (const Entry entry : entries()) {
    SCOPED_TRACE(name_of(entry));
    const Outcome checked = only_the_value_check_catches(run, entry, x, expected, write, undo);
    // The error begins with what the user called (the region guard's own).
    expect_contains(checked.error, std::string(entry == Entry::Region ? "sac::CheckpointRegion"
                                                                      : "sac::checkpoint") +
                                       ": the recomputation of");
    expect_contains(checked.error, "gave a different value than its forward to tensor 3 of the 4");
    expect_contains(checked.error, "not made in the region (an input, a parameter, a buffer");
    expect_contains(checked.error, "saved for backward by aten::mul");
    expect_contains(checked.error, "Its values differ (checksum");
    // Nothing left behind: the same region with the buffer untouched is exact.
    const Outcome after = run.checkpointed(entry, with_check(DeterminismCheck::Values), x);
    EXPECT_TRUE(after.error.empty()) << after.error;
    sac_test::expect_bit_identical(expected, after.grads);
  }
}

// Named by the op that made the tensor: the drift op, whose output mul
// saves; and tanh's output, which autograd saves before tanh has returned,
// as tanh's own (not as a tensor from outside the region).
TEST_P(ValueCheck, AnOpThatDrawsFromItsOwnStateIsNamed) {
  torch::manual_seed(0);
  const at::Tensor w = torch::randn({16, 16}, torch::requires_grad());
  const at::Tensor x = torch::randn({8, 16}, torch::requires_grad());
  const std::vector<std::pair<Program, std::string>> programs = {
      {[&](const at::Tensor& in) { return in.mm(w) * call("sac_values_test::drift", in.detach()); },
       "made by sac_values_test::drift (its call 0 in the region), saved for backward by "
       "aten::mul"},
      {[&](const at::Tensor& in) {
         return at::tanh(in.mm(w) + call("sac_values_test::drift", in.detach()));
       },
       "to tensor 2 of the 3 that autograd saved there: made and saved for backward by "
       "aten::tanh (its call 0 in the region)."}};
  for (const auto& [program, named] : programs) {
    const ProgramRuns run(program, {x, w});
    const auto expected = run.plain(x);
    for (const Entry entry : entries()) {
      SCOPED_TRACE(name_of(entry));
      const Outcome checked = only_the_value_check_catches(run, entry, x, expected);
      expect_contains(checked.error, named);
      expect_contains(checked.error,
                      entry == Entry::Applied ? "region `1`" : "a region with no name");
    }
  }
}

// Issue 44: random ops drawing in place into memory the region made
// (dropout on the CPU: empty_like, bernoulli_, div_, mul), recomputed
// without the forward's generators (preserve_rng_state off): the check let
// them through under the region guard, whose replay runs below autograd,
// where in-place ops bump no version. Each is named, by the op that drew.
TEST_P(ValueCheck, RandomOpsDrawingInPlaceAreNamed) {
  torch::manual_seed(0);
  const at::Tensor w = torch::randn({16, 16}, torch::requires_grad());
  const at::Tensor x = torch::randn({8, 16}, torch::requires_grad());
  using Fill = std::function<void(at::Tensor&)>;
  const std::vector<std::pair<Fill, std::string>> fills = {
      {[](at::Tensor& t) { t.bernoulli_(0.5); }, "aten::bernoulli_"},
      {[](at::Tensor& t) { t.uniform_(); }, "aten::uniform_"},
      {[](at::Tensor& t) { t.normal_(); }, "aten::normal_"},
      {[](at::Tensor& t) { t.random_(0, 3); }, "aten::random_"},
      {[](at::Tensor& t) { t.exponential_(); }, "aten::exponential_"}};
  std::vector<std::pair<Program, std::string>> programs;
  for (const auto& [fill, name] : fills) {
    programs.emplace_back(
        [&, fill = fill](const at::Tensor& in) {
          at::Tensor h = in.mm(w).tanh();
          at::Tensor noise = torch::empty_like(h);
          fill(noise);
          return h * noise;
        },
        "made by the random op " + name);
  }
  programs.emplace_back(
      [&](const at::Tensor& in) { return torch::dropout(in.mm(w).tanh(), 0.5, true) * 2; },
      "its values drawn by the random op aten::bernoulli_");  // made by div_
  const auto options = [](DeterminismCheck check) {
    return with_check(check).preserve_rng_state(false);
  };
  for (const auto& [program, named] : programs) {
    SCOPED_TRACE(named);
    const ProgramRuns run(program, {x, w});
    for (const Entry entry : entries()) {
      SCOPED_TRACE(name_of(entry));
      torch::manual_seed(7);
      const auto expected = run.plain(x);
      torch::manual_seed(7);
      expect_silently_wrong(expected,
                            run.checkpointed(entry, options(DeterminismCheck::Default), x));
      torch::manual_seed(7);
      const Outcome checked = run.checkpointed(entry, options(DeterminismCheck::Values), x);
      expect_contains(checked.error, "gave a different value than its forward");
      expect_contains(checked.error, named);
      // With the forward's generators, the same program is exact.
      torch::manual_seed(7);
      const Outcome exact = run.checkpointed(entry, with_check(DeterminismCheck::Values), x);
      EXPECT_TRUE(exact.error.empty()) << exact.error;
      sac_test::expect_bit_identical(expected, exact.grads);
    }
  }
}

// torch::tensor(host values) in the region: aten::empty makes the storage,
// its values come through the data pointer. (The region guard replays the
// values it recorded: exact.)
TEST_P(ValueCheck, HostDataIsNamedAsHostData) {
  torch::manual_seed(0);
  const at::Tensor w = torch::randn({16, 16}, torch::requires_grad());
  const at::Tensor x = torch::randn({8, 16}, torch::requires_grad());
  const ProgramRuns run([&](const at::Tensor& in) { return in.mm(w) * host_scale(16); }, {x, w});
  const auto expected = run.plain(x);
  for (const Entry entry : entries()) {
    SCOPED_TRACE(name_of(entry));
    if (entry == Entry::Region) {
      const Outcome replayed = run.checkpointed(entry, with_check(DeterminismCheck::Values), x);
      EXPECT_TRUE(replayed.error.empty()) << replayed.error;
      sac_test::expect_bit_identical(expected, replayed.grads);
      continue;
    }
    const Outcome checked = only_the_value_check_catches(run, entry, x, expected);
    expect_contains(checked.error, "host data: made by aten::empty");
    expect_contains(checked.error, "then filled through its data pointer, as torch::tensor(...) "
                                   "fills it, saved for backward by aten::mul");
  }
}

// BatchNorm in training with a backward inside the forward: the inner
// backward recomputes the region so far, after BatchNorm updated its
// running statistics (saved before, through a schema that does not say it
// writes them), and its own backward saves them again. None of it is a
// recomputation reading different values: no error, exact gradients.
TEST_P(ValueCheck, BatchNormWithABackwardInsideTheForwardIsNoFalseAlarm) {
  torch::manual_seed(0);
  torch::nn::Linear linear(16, 16);
  torch::nn::BatchNorm1d norm(16);
  const at::Tensor x = torch::randn({8, 16}, torch::requires_grad());
  const ProgramRuns run(
      [&](const at::Tensor& in) {
        const at::Tensor h = norm->forward(linear->forward(in));
        const at::Tensor g = torch::autograd::grad({h.sin().sum()}, {in}, {}, /*retain_graph=*/true,
                                                   /*create_graph=*/true)[0];
        return (h * g.sum(1, true)).tanh();
      },
      {x, linear->weight, norm->weight, norm->bias});
  const auto expected = run.plain(x);
  for (const Entry entry : entries()) {
    SCOPED_TRACE(name_of(entry));
    for (const DeterminismCheck check : {DeterminismCheck::Default, DeterminismCheck::Values}) {
      const Outcome outcome = run.checkpointed(entry, with_check(check), x);
      EXPECT_TRUE(outcome.error.empty()) << outcome.error;
      sac_test::expect_bit_identical(expected, outcome.grads);
    }
  }
}

// Running statistics saved after another region's recomputation updated
// them: a region under the value check differentiates, inside its forward,
// through a BatchNorm checkpointed in another region (found by the fuzzer).
// That region recomputes then, and again when this one recomputes; each time
// BatchNorm updates its statistics, and its backward saves them here. Not a
// recomputation reading different values: no error, exact gradients.
TEST_P(ValueCheck, RunningStatisticsAnotherRegionUpdatesAreNoFalseAlarm) {
  torch::manual_seed(0);
  torch::nn::BatchNorm1d norm(16);
  const at::Tensor x = torch::randn({8, 16}, torch::requires_grad());
  const at::Tensor w = torch::randn({16, 16}, torch::requires_grad());
  auto normed = [&](const at::Tensor& in) { return norm->forward(in.mm(w)); };
  auto uses_grad = [&](const at::Tensor& h) {
    return [&x, h](const at::Tensor& in) {
      const at::Tensor g = torch::autograd::grad({(h.sin() * in).sum()}, {x}, {},
                                                 /*retain_graph=*/true, /*create_graph=*/true)[0];
      return (g * in).tanh();
    };
  };
  auto grads = [&](bool checkpointed) {
    const at::Tensor h = checkpointed ? sac::checkpoint(normed, x) : normed(x);
    const at::Tensor y = h * 2;
    const at::Tensor out =
        checkpointed ? sac::checkpoint(with_check(DeterminismCheck::Values), uses_grad(h), y)
                     : uses_grad(h)(y);
    return torch::autograd::grad({out.sum()}, {x, w, norm->weight, norm->bias});
  };
  const auto expected = grads(false);
  try {
    sac_test::expect_bit_identical(expected, grads(true));
  } catch (const c10::Error& e) {
    FAIL() << e.what_without_backtrace();
  }
}

// apply_activation_checkpointing without options: its regions take the
// scope's options (here a debugging run's value check) and are still named
// by module.
TEST_P(ValueCheck, RegionsAppliedWithoutOptionsAreNamedByModule) {
  torch::manual_seed(0);
  const at::Tensor w = torch::randn({16, 16}, torch::requires_grad());
  const at::Tensor x = torch::randn({8, 16}, torch::requires_grad());
  torch::nn::Sequential model{torch::nn::Identity(), ProgramModule([&](const at::Tensor& in) {
                                return in.mm(w) * call("sac_values_test::drift", in.detach());
                              })};
  ASSERT_EQ(sac::apply_activation_checkpointing(
                model.ptr(),
                [](const std::string& name, const torch::nn::Module&) { return name == "1"; }),
            1);
  drift_calls = 0;
  sac::DeterminismCheckGuard values(DeterminismCheck::Values);
  const at::Tensor y = model->forward(x);
  const std::string message = sac_test::error_of([&] { torch::autograd::grad({y.sum()}, {x, w}); });
  expect_contains(message, "sac::checkpoint: the recomputation of region `1` gave a different");
}

// A router: top-1 of scores from a tie broken by 1e-4, which the
// recomputation's 2e-4 flips: every token goes to the other expert. Same
// shapes, so the default check passes with wrong expert gradients; the
// value check names the top-k; keeping the ops that decide shapes and
// control flow (shape_deciding_ops) makes it exact.
TEST_P(ValueCheck, ARouterWhoseTopKFlipsIsNamedAndKeepingItIsExact) {
  torch::manual_seed(0);
  const at::Tensor router = torch::randn({16, 1}).repeat({1, 4});  // experts 0 and 1 tie
  const at::Tensor bias = torch::tensor({1e-4f, 0.0f, -100.0f, -100.0f});
  const at::Tensor experts = torch::randn({4, 16}, torch::requires_grad());
  const at::Tensor x = torch::randn({8, 16}, torch::requires_grad());
  const ProgramRuns run(
      [&](const at::Tensor& in) {
        const at::Tensor scores = call("sac_values_test::jitter", in.detach().mm(router) + bias);
        const at::Tensor chosen = std::get<1>(scores.topk(1)).squeeze(1);
        return in * experts.index_select(0, chosen);
      },
      {x, experts});
  const auto expected = run.plain(x);
  const sac::Policy keep_routes = sac::any_of({sac::nothing_saveable(), sac::shape_deciding_ops()});
  for (const Entry entry : entries()) {
    SCOPED_TRACE(name_of(entry));
    const Outcome checked = only_the_value_check_catches(run, entry, x, expected);
    expect_contains(checked.error, "made by aten::topk (its call 0 in the region), saved for "
                                   "backward by aten::index_select");

    const Outcome kept =
        run.checkpointed(entry, with_check(DeterminismCheck::Values).policy(keep_routes), x);
    EXPECT_TRUE(kept.error.empty()) << kept.error;
    sac_test::expect_bit_identical(expected, kept.grads);
  }
}

INSTANTIATE_TEST_SUITE_P(Checksums, ValueCheck, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "TensorOps" : "Memory"; });

// The checksum itself: equal bits give equal sums, in either path and for
// any layout; one ulp or one swapped pair changes it.
TEST(ValueChecksum, IsBitForBit) {
  using sac::detail::ValueChecksum;
  for (const bool ops : {false, true}) {
    SCOPED_TRACE(ops ? "tensor ops" : "memory");
    sac::detail::checksum_with_tensor_ops_for_testing(ops);
    torch::manual_seed(0);
    const at::Tensor a = torch::randn({33, 17});
    const ValueChecksum sum = ValueChecksum::of(a);
    EXPECT_TRUE(sum.matches(ValueChecksum::of(a.clone())));
    EXPECT_TRUE(ValueChecksum::of(a.t()).matches(ValueChecksum::of(a.t().contiguous())));
    EXPECT_TRUE(ValueChecksum::of(a.slice(1, 0, 17, 2))
                    .matches(ValueChecksum::of(a.slice(1, 0, 17, 2).contiguous())));
    at::Tensor ulp = a.clone();
    ulp[5][7] = std::nextafter(ulp[5][7].item<float>(), 1e9f);
    EXPECT_FALSE(sum.matches(ValueChecksum::of(ulp)));
    at::Tensor swapped = a.clone();
    swapped[0][0] = a[0][1];
    swapped[0][1] = a[0][0];
    EXPECT_FALSE(sum.matches(ValueChecksum::of(swapped)));
    for (const auto dtype : {at::kBool, at::kByte, at::kHalf, at::kLong, at::kComplexFloat}) {
      const at::Tensor t = torch::randn({3, 5}).to(dtype);
      EXPECT_TRUE(ValueChecksum::of(t).matches(ValueChecksum::of(t.clone()))) << dtype;
    }
    EXPECT_NE(sum.str(), ValueChecksum::of(ulp).str());
  }
  sac::detail::checksum_with_tensor_ops_for_testing(false);
}

}  // namespace
