// Faults inside checkpointed regions: an exception from the checkpointed
// function (in forward, in recomputation, in a nested region), from a policy
// callback, or from the allocator while outputs are being cached or
// recomputed. Each reaches the caller as the exception it was; the thread's
// interception state, saved-tensor hooks and RNG state are restored; memory
// (in exact bytes) returns to where it was, however often the fault repeats;
// and the next step, with the same policy object, is bit-identical to the
// un-checkpointed run.
#include "support.h"

#include <sac/dispatch/internal/interceptor.h>

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <vector>

namespace checkpoint_faults_test {

using sac_test::CountingAllocator;
using sac_test::expect_bit_identical;
using sac_test::run_and_grad;

// The counting allocator with an injected fault: after arm(n), the n-th
// allocation throws a c10::Error (once; the allocator then disarms). Memory
// is still counted exactly by the counting allocator it wraps.
class FaultInjectingAllocator final : public c10::Allocator {
 public:
  static FaultInjectingAllocator& install() {
    static FaultInjectingAllocator* allocator = [] {
      CountingAllocator::install();
      auto* faulty = new FaultInjectingAllocator(c10::GetCPUAllocator());
      c10::SetCPUAllocator(faulty, /*priority=*/101);  // above the counting one
      return faulty;
    }();
    EXPECT_EQ(c10::GetCPUAllocator(), allocator) << "another CPU allocator took over";
    return *allocator;
  }

  void arm(int64_t nth) { countdown_.store(nth); }
  void disarm() { countdown_.store(0); }
  bool armed() const { return countdown_.load() > 0; }
  // Allocations since install (counted whether armed or not).
  int64_t allocations() const { return allocations_.load(); }
  int64_t failures() const { return failures_.load(); }

  c10::DataPtr allocate(size_t bytes) override {
    ++allocations_;
    int64_t left = countdown_.load();
    while (left > 0 && !countdown_.compare_exchange_weak(left, left - 1)) {
    }
    if (left == 1) {
      ++failures_;
      TORCH_CHECK(false, "injected allocation failure (", bytes, " bytes)");
    }
    return inner_->allocate(bytes);
  }
  c10::DeleterFnPtr raw_deleter() const override { return inner_->raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    inner_->copy_data(dest, src, count);
  }

 private:
  explicit FaultInjectingAllocator(c10::Allocator* inner) : inner_(inner) {}
  c10::Allocator* inner_;
  std::atomic<int64_t> countdown_{0};
  std::atomic<int64_t> allocations_{0};
  std::atomic<int64_t> failures_{0};
};

// Runs `f`, expects it to throw an E, and returns the message (without
// backtrace for a c10::Error). Another exception, or none, fails the test.
template <class E>
std::string thrown(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    if (const auto* expected = dynamic_cast<const E*>(&e)) {
      if constexpr (std::is_base_of_v<c10::Error, E>) {
        return expected->what_without_backtrace();
      } else {
        return expected->what();
      }
    }
    const auto* error = dynamic_cast<const c10::Error*>(&e);
    ADD_FAILURE() << "expected a " << typeid(E).name() << ", got a " << typeid(e).name() << ": "
                  << (error != nullptr ? error->what_without_backtrace() : e.what());
    return {};
  }
  ADD_FAILURE() << "expected an exception, none was thrown";
  return {};
}

#define EXPECT_CONTAINS(text, fragment) \
  EXPECT_NE(std::string(text).find(fragment), std::string::npos) << "in: " << (text)

// Nothing of sac is left on this thread.
void expect_clean_thread_state() {
  EXPECT_EQ(sac::detail::active_interceptor(), nullptr) << "an interceptor is still active";
  EXPECT_FALSE(c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::Fake))
      << "the Fake key is still in the thread's included set";
  EXPECT_TRUE(c10::GradMode::is_enabled()) << "grad mode left disabled";
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU)) << "autocast left enabled";
}

at::Tensor cpu_rng_state() { return at::detail::getDefaultCPUGenerator().get_state(); }

enum class Kind { Full, SaveOps, Callback };

std::string name_of(const ::testing::TestParamInfo<Kind>& info) {
  switch (info.param) {
    case Kind::Full: return "FullRecompute";
    case Kind::SaveOps: return "SaveOps";
    case Kind::Callback: return "Callback";
  }
  return "Unknown";
}

class Faults : public ::testing::Test {
 protected:
  void SetUp() override {
    sac_test::expect_configured_mechanism();
    at::set_num_threads(1);
    allocator = &FaultInjectingAllocator::install();
    allocator->disarm();
    torch::manual_seed(0);
    mlp = sac_test::Mlp(16, 32, 8, /*depth=*/3);
    params = mlp->parameters();
    x = torch::randn({6, 16}, torch::requires_grad());
    // Saves the matmuls and the relus. Throws on its 3rd call (of a forward,
    // or of a recomputation) while `policy_fault` is armed.
    callback = sac::Policy::from_fn(
        [fault = policy_fault](const sac::SelectiveCheckpointContext& ctx,
                               const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue>) {
          if (fault->armed && ++fault->calls == 3) {
            throw std::runtime_error("policy failure on its 3rd call");
          }
          if (fault->arm_allocator_after_relu > 0 && op.operator_name().name == "aten::relu" &&
              --fault->arm_allocator_after_relu == 0) {
            // The next allocation is this addmm's output, inside the caching
            // mode, which is about to cache it.
            FaultInjectingAllocator::install().arm(1);
          }
          const auto& name = op.operator_name().name;
          return name == "aten::addmm" || name == "aten::relu";
        });
    reference = run_and_grad([&] { return region(x); }, {x}, params);
    // Warm up every path once: lazily created state must not count below.
    for (const auto kind : {Kind::Full, Kind::SaveOps, Kind::Callback}) {
      expect_bit_identical(reference, checkpointed_step(options_for(kind)));
    }
    {
      const int64_t before = live();
      auto y = region(x);
      plain_forward_bytes = live() - before;
      EXPECT_GT(plain_forward_bytes, 0);
    }
    rebase();
  }

  void TearDown() override { allocator->disarm(); }

  static int64_t live() { return CountingAllocator::live_bytes(); }
  // Tensors alive now are the test's own: the baseline memory must return to.
  void rebase() { baseline = live(); }

  // The region: the MLP, then a few ops. `hook(stage)` runs at stage 0
  // (start), 1 (after the MLP) and 2 (end), in forward and recomputation.
  at::Tensor region(const at::Tensor& in) {
    if (hook) hook(0);
    auto h = mlp->forward(in);
    if (hook) hook(1);
    auto out = torch::tanh(h).mul(2);
    if (hook) hook(2);
    return out;
  }
  std::function<at::Tensor(const at::Tensor&)> region_fn() {
    return [this](const at::Tensor& in) { return region(in); };
  }

  sac::CheckpointOptions options_for(Kind kind) const {
    switch (kind) {
      case Kind::Full: return {};
      case Kind::SaveOps: return sac::CheckpointOptions().policy(save_ops);
      case Kind::Callback: return sac::CheckpointOptions().policy(callback);
    }
    return {};
  }

  std::vector<at::Tensor> checkpointed_step(const sac::CheckpointOptions& options) {
    return run_and_grad([&] { return sac::checkpoint(options, region_fn(), x); }, {x}, params);
  }

  // After a fault: clean thread, memory back at the baseline, plain autograd
  // as before (its activations are saved, not packed by a stale hook), and a
  // checkpointed step with `options` (the same policy object) bit-identical.
  void expect_recovered(const sac::CheckpointOptions& options) {
    expect_clean_thread_state();
    EXPECT_EQ(live(), baseline) << "memory did not return to the baseline after the fault";
    {
      const int64_t before = live();
      auto y = region(x);
      EXPECT_EQ(live() - before, plain_forward_bytes)
          << "a plain forward after the fault keeps other activations than before it";
    }
    expect_bit_identical(reference, run_and_grad([&] { return region(x); }, {x}, params));
    expect_bit_identical(reference, checkpointed_step(options));
    expect_clean_thread_state();
    EXPECT_EQ(live(), baseline);
  }

  std::vector<at::Tensor> grads_of(const at::Tensor& y) {
    std::vector<at::Tensor> wrt{x};
    wrt.insert(wrt.end(), params.begin(), params.end());
    auto grads = torch::autograd::grad({y.sum()}, wrt);
    grads.insert(grads.begin(), y.detach());
    return grads;
  }

  // For n = 1, 2, ...: a fresh forward, then the n-th allocation of the
  // backward fails, until the backward allocates fewer than n times.
  void sweep_allocation_failures_through_backward(const sac::CheckpointOptions& options) {
    int faults = 0;
    bool completed = false;
    for (int64_t n = 1; n < 1000 && !completed; ++n) {
      SCOPED_TRACE("allocation " + std::to_string(n));
      // Shown if the child process dies: where the sweep was.
      std::cerr << "failing allocation " << n << " of the backward\n";
      {
        auto y = sac::checkpoint(options, region_fn(), x);
        const auto rng_before = cpu_rng_state();
        try {
          allocator->arm(n);
          const auto grads = grads_of(y);
          // Still armed: the n-th allocation never came, the sweep is done.
          // (Disarmed: the failure was handled inside; the result must be
          // right all the same.)
          completed = allocator->armed();
          allocator->disarm();
          expect_bit_identical(reference, grads);
        } catch (const c10::Error& e) {
          EXPECT_CONTAINS(e.what_without_backtrace(), "injected allocation failure");
          ++faults;
        }
        allocator->disarm();
        expect_clean_thread_state();
        EXPECT_TRUE(torch::equal(cpu_rng_state(), rng_before));
      }
      ASSERT_EQ(live(), baseline) << "dropping the graph after the fault did not free everything";
    }
    EXPECT_TRUE(completed);
    EXPECT_GE(faults, 10) << "the backward allocates for each op";
    expect_recovered(options);
  }

  struct PolicyFault {
    bool armed = false;
    int calls = 0;
    int arm_allocator_after_relu = 0;  // arm the allocator at this relu call
  };

  static constexpr int kRepeats = 20;
  FaultInjectingAllocator* allocator = nullptr;
  sac_test::Mlp mlp{nullptr};
  std::vector<at::Tensor> params;
  at::Tensor x;
  std::function<void(int)> hook;
  std::shared_ptr<PolicyFault> policy_fault = std::make_shared<PolicyFault>();
  sac::Policy save_ops = sac::Policy::save_ops({"aten::addmm"});
  sac::Policy callback = save_ops;
  std::vector<at::Tensor> reference;
  int64_t plain_forward_bytes = 0;
  int64_t baseline = 0;
};

class FaultsPerPolicy : public Faults, public ::testing::WithParamInterface<Kind> {};

// ---- 1. The checkpointed function throws during the forward ---------------

TEST_P(FaultsPerPolicy, FunctionThrowsInForward) {
  const auto options = options_for(GetParam());
  hook = [](int stage) {
    if (stage == 1) throw std::runtime_error("user failure in forward");
  };
  for (int i = 0; i < kRepeats; ++i) {
    const auto message =
        thrown<std::runtime_error>([&] { sac::checkpoint(options, region_fn(), x); });
    EXPECT_EQ(message, "user failure in forward");
    expect_clean_thread_state();
    ASSERT_EQ(live(), baseline) << "repeat " << i;
  }
  hook = nullptr;
  expect_recovered(options);
}

// ---- 2. The checkpointed function throws only when recomputed --------------

TEST_P(FaultsPerPolicy, FunctionThrowsOnlyInRecomputation) {
  const auto options = options_for(GetParam());
  bool recomputing = false;
  hook = [&](int stage) {
    if (recomputing && stage == 1) throw std::runtime_error("user failure in recomputation");
  };
  for (int i = 0; i < kRepeats; ++i) {
    {
      recomputing = false;
      auto y = sac::checkpoint(options, region_fn(), x);
      recomputing = true;
      const auto rng_before = cpu_rng_state();
      const auto message = thrown<std::runtime_error>([&] { grads_of(y); });
      EXPECT_EQ(message, "user failure in recomputation");
      expect_clean_thread_state();
      EXPECT_TRUE(torch::equal(cpu_rng_state(), rng_before))
          << "the forward's RNG state was left in place by the failed recomputation";
    }
    ASSERT_EQ(live(), baseline) << "repeat " << i << ": dropping the graph did not free everything";
  }
  recomputing = false;
  hook = nullptr;
  expect_recovered(options);
}

// ---- 3. The policy callback throws ------------------------------------------

TEST_F(Faults, PolicyThrowsInForward) {
  {
    const auto options = sac::CheckpointOptions().policy(callback);
    for (int i = 0; i < kRepeats; ++i) {
      *policy_fault = {};
      policy_fault->armed = true;
      const auto message =
          thrown<std::runtime_error>([&] { sac::checkpoint(options, region_fn(), x); });
      EXPECT_EQ(message, "policy failure on its 3rd call");
      EXPECT_EQ(policy_fault->calls, 3);
      expect_clean_thread_state();
      ASSERT_EQ(live(), baseline) << "repeat " << i;
    }
    *policy_fault = {};
    expect_recovered(options);
    expect_recovered(options_for(Kind::Callback));
  }
}

// ---- 4. Allocation failures ---------------------------------------------------

// The n-th allocation of the checkpointed call fails, for every n from the
// first allocation (sac's own setup) through the forward's ops and their
// caching, until the call allocates fewer than n times.
TEST_P(FaultsPerPolicy, AllocationFailureAtEachAllocationOfTheForward) {
  const auto options = options_for(GetParam());
  int faults = 0;
  bool completed = false;
  for (int64_t n = 1; n < 1000 && !completed; ++n) {
    SCOPED_TRACE("allocation " + std::to_string(n));
    std::vector<at::Tensor> grads;
    try {
      allocator->arm(n);
      auto y = sac::checkpoint(options, region_fn(), x);
      // Still armed: the n-th allocation never came, the sweep is done.
      completed = allocator->armed();
      allocator->disarm();
      grads = grads_of(y);
    } catch (const c10::Error& e) {
      allocator->disarm();
      ASSERT_FALSE(completed) << "the backward failed: " << e.what_without_backtrace();
      EXPECT_CONTAINS(e.what_without_backtrace(), "injected allocation failure");
      ++faults;
      expect_clean_thread_state();
      ASSERT_EQ(live(), baseline);
      continue;
    }
    expect_bit_identical(reference, grads);
  }
  EXPECT_TRUE(completed);
  EXPECT_GE(faults, 6) << "the forward allocates at least once per op";
  expect_recovered(options);
}

// The allocation of a saved op's output fails inside the caching mode: the
// policy callback arms the allocator when it is asked about the k-th relu
// (asked after the relu ran), so the next allocation is the output of the
// addmm after it, which the policy saves.
TEST_F(Faults, AllocationFailureWhileCachingASavedOutput) {
  const auto options = options_for(Kind::Callback);
  for (int k = 1; k <= 2; ++k) {
    SCOPED_TRACE("relu " + std::to_string(k));
    for (int i = 0; i < kRepeats; ++i) {
      *policy_fault = {};
      policy_fault->arm_allocator_after_relu = k;
      const int64_t failures = allocator->failures();
      const auto message = thrown<c10::Error>([&] { sac::checkpoint(options, region_fn(), x); });
      allocator->disarm();
      // The failed allocation is the next addmm's output: [6, 32] floats
      // for a hidden layer, [6, 8] for the last.
      EXPECT_CONTAINS(message, "injected allocation failure (" +
                                   std::to_string(k < 2 ? 6 * 32 * 4 : 6 * 8 * 4) + " bytes)");
      EXPECT_EQ(allocator->failures(), failures + 1);
      expect_clean_thread_state();
      ASSERT_EQ(live(), baseline) << "repeat " << i;
    }
  }
  *policy_fault = {};
  expect_recovered(options);
}

// The n-th allocation of the recomputed function fails, for every n; the
// function runs to its end (no early stop) and disarms the allocator there.
TEST_P(FaultsPerPolicy, AllocationFailureAtEachAllocationOfTheRecomputation) {
  const auto options = options_for(GetParam()).early_stop(false);
  bool recomputing = false;
  int64_t n = 0;
  hook = [&](int stage) {
    if (!recomputing) return;
    if (stage == 0) allocator->arm(n);
    if (stage == 2) allocator->disarm();
  };
  int faults = 0;
  bool completed = false;
  for (n = 1; n < 1000 && !completed; ++n) {
    SCOPED_TRACE("allocation " + std::to_string(n));
    {
      recomputing = false;
      auto y = sac::checkpoint(options, region_fn(), x);
      recomputing = true;
      const auto rng_before = cpu_rng_state();
      const int64_t failures = allocator->failures();
      try {
        const auto grads = grads_of(y);
        // No failure: the function allocates fewer than n times, the sweep
        // is done. (A failure handled inside must leave the result right.)
        completed = allocator->failures() == failures;
        expect_bit_identical(reference, grads);
      } catch (const c10::Error& e) {
        EXPECT_CONTAINS(e.what_without_backtrace(), "injected allocation failure");
        ++faults;
      }
      allocator->disarm();
      expect_clean_thread_state();
      EXPECT_TRUE(torch::equal(cpu_rng_state(), rng_before));
    }
    ASSERT_EQ(live(), baseline) << "dropping the graph after the fault did not free everything";
  }
  recomputing = false;
  hook = nullptr;
  EXPECT_TRUE(completed);
  EXPECT_GE(faults, 3) << "the recomputation allocates for each op it recomputes";
  expect_recovered(options_for(GetParam()));
}

// The n-th allocation of the backward fails, for every n, wherever it falls:
// autograd's own ops, sac's setup and teardown of the recomputation, the
// recomputed ops, the cache. A failure
// that terminated the process would take the rest of this binary with it, so
// the sweep runs in a child process (a gtest death test), which must exit
// normally, with no failed expectation.
TEST_P(FaultsPerPolicy, AllocationFailureAnywhereInTheBackward) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        sweep_allocation_failures_through_backward(options_for(GetParam()));
        std::exit(::testing::Test::HasFailure() ? 1 : 0);
      },
      ::testing::ExitedWithCode(0), "");
}

// ---- 5. A nested region's function throws during the outer recomputation ----

TEST_F(Faults, NestedRegionThrowsDuringOuterRecomputation) {
  torch::manual_seed(3);
  auto w = torch::randn({16, 16}, torch::requires_grad());
  auto in = torch::randn({4, 16}, torch::requires_grad());
  bool recomputing = false;
  int inner_calls = 0;
  auto inner = [&](const at::Tensor& h) {
    ++inner_calls;
    TORCH_CHECK(!recomputing, "inner region failure");
    return torch::tanh(h.mm(w)).mm(w);
  };
  const auto mm = sac::Policy::save_ops({"aten::mm"});
  const std::vector<std::pair<std::string, sac::CheckpointOptions>> all{
      {"full", sac::CheckpointOptions()},
      {"save mm", sac::CheckpointOptions().policy(mm)},
      {"callback", sac::CheckpointOptions().policy(callback)}};
  for (const auto& outer_case : all) {
    for (const auto& inner_case : all) {
      SCOPED_TRACE("outer " + outer_case.first + ", inner " + inner_case.first);
      const sac::CheckpointOptions& outer_options = outer_case.second;
      const sac::CheckpointOptions& inner_options = inner_case.second;
      auto outer = [&](const at::Tensor& t) {
        auto h = torch::sigmoid(t.mm(w));
        h = sac::checkpoint(inner_options, inner, h);
        return torch::relu(h.mm(w));
      };
      recomputing = false;
      const auto expected = run_and_grad([&] { return outer(in); }, {in}, {w});
      rebase();  // `expected` stays alive
      for (int i = 0; i < kRepeats; ++i) {
        {
          recomputing = false;
          auto y = sac::checkpoint(outer_options, outer, in);
          recomputing = true;
          inner_calls = 0;
          const auto rng_before = cpu_rng_state();
          const auto message = thrown<c10::Error>([&] {
            torch::autograd::grad({y.sum()}, {in, w});
          });
          EXPECT_CONTAINS(message, "inner region failure");
          EXPECT_EQ(inner_calls, 1) << "the outer recomputation ran the inner region's forward";
          expect_clean_thread_state();
          EXPECT_TRUE(torch::equal(cpu_rng_state(), rng_before));
        }
        ASSERT_EQ(live(), baseline) << "repeat " << i;
      }
      recomputing = false;
      expect_clean_thread_state();
      expect_bit_identical(expected, run_and_grad([&] { return outer(in); }, {in}, {w}));
      expect_bit_identical(expected,
                           run_and_grad([&] { return sac::checkpoint(outer_options, outer, in); },
                                        {in}, {w}));
      EXPECT_EQ(live(), baseline);
    }
  }
  // The MLP region with the fixture's policy objects still works too.
  for (const auto kind : {Kind::Full, Kind::SaveOps, Kind::Callback}) {
    expect_bit_identical(reference, checkpointed_step(options_for(kind)));
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, FaultsPerPolicy,
                         ::testing::Values(Kind::Full, Kind::SaveOps, Kind::Callback), name_of);

}  // namespace checkpoint_faults_test
