// The dispatch floor: which mechanism is used, interceptors below autograd,
// suspension while an interceptor runs, nesting, and thread-local state
// across exceptions.
#include "support.h"

#include <sac/dispatch/internal/interceptor.h>
#include <sac/policy/internal/op_names.h>
#include <sac/dispatch/internal/registry.h>
#include <sac/dispatch/internal/factory_ops.h>

#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace dispatch_test {

using sac::dispatch::Mechanism;
using sac_test::error_of;

c10::OperatorHandle op_of(const char* name, const char* overload = "") {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

size_t count_of(const std::vector<std::string>& names, const std::string& name) {
  return static_cast<size_t>(std::count(names.begin(), names.end(), name));
}

// Records the name of each op it sees, then runs it.
class Recorder : public sac::detail::OpInterceptor {
 public:
  void intercept(const c10::OperatorHandle& op, c10::DispatchKeySet below,
                 torch::jit::Stack* stack) override {
    names.push_back(c10::toString(op.operator_name()));
    sac::detail::run_op(op, below, stack);
  }
  std::vector<std::string> names;
};

// Makes sure the ops the tests call are intercepted with either mechanism.
void intercept_test_ops() {
  const std::vector<c10::OperatorHandle> ops{op_of("aten::mm"), op_of("aten::add", "Tensor")};
  sac::detail::intercept_ops(ops);
}

struct Operands {
  at::Tensor a, b;
};

Operands operands() {
  torch::manual_seed(0);
  return {torch::randn({3, 4}, torch::requires_grad()), torch::randn({4, 2})};
}

class DispatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sac_test::expect_configured_mechanism();
    intercept_test_ops();
    ASSERT_EQ(sac::detail::active_interceptor(), nullptr) << "left active by an earlier test";
  }
  void TearDown() override {
    EXPECT_EQ(sac::detail::active_interceptor(), nullptr);
    EXPECT_FALSE(c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::Fake));
  }
};

// ---- Mechanism -------------------------------------------------------------------

TEST_F(DispatchTest, MechanismMatchesSacDispatch) {
  const char* env = std::getenv("SAC_DISPATCH");
  const std::string name = env == nullptr ? "" : env;
  if (name == "per_op") {
    EXPECT_EQ(sac::dispatch::mechanism(), Mechanism::PerOpKernels);
  } else if (name == "fallback") {
    EXPECT_EQ(sac::dispatch::mechanism(), Mechanism::FallbackKey);
  } else {
    GTEST_SKIP() << "SAC_DISPATCH is '" << name << "', neither per_op nor fallback";
  }
}

TEST_F(DispatchTest, MechanismNamesDescribeThePlacement) {
  EXPECT_EQ(sac::dispatch::to_string(Mechanism::PerOpKernels), "per-op kernels on ADInplaceOrView");
  EXPECT_EQ(sac::dispatch::to_string(Mechanism::FallbackKey), "fallback on the Fake key");
}

// LibTorch 2.13 leaves the Fake key unused; sac's own fallback on it (with
// SAC_DISPATCH=fallback) does not make it unavailable.
TEST_F(DispatchTest, FallbackKeyIsAvailable) {
  std::string reason;
  EXPECT_TRUE(sac::detail::fallback_key_available(&reason)) << reason;
  EXPECT_TRUE(sac::detail::fallback_key_available());
}

TEST_F(DispatchTest, SwitchingMechanismAfterInterceptionThrows) {
  {
    Recorder recorder;
    sac::detail::InterceptorGuard guard(&recorder);  // interception is in use now
  }
  const Mechanism current = sac::dispatch::mechanism();
  const Mechanism other =
      current == Mechanism::PerOpKernels ? Mechanism::FallbackKey : Mechanism::PerOpKernels;
  const auto msg = error_of([&] { sac::dispatch::set_mechanism(other); });
  EXPECT_TRUE(contains(msg, "cannot switch the dispatch mechanism")) << msg;
  EXPECT_TRUE(contains(msg, "already in use")) << msg;
  EXPECT_TRUE(contains(msg, "SAC_DISPATCH")) << msg;
  EXPECT_TRUE(contains(msg, "set_mechanism")) << msg;
  // Asking for the mechanism in use is fine, and changes nothing.
  EXPECT_NO_THROW(sac::dispatch::set_mechanism(current));
  EXPECT_EQ(sac::dispatch::mechanism(), current);
}

// ---- Interception ----------------------------------------------------------------

TEST_F(DispatchTest, InterceptorSeesOpsBelowAutograd) {
  const auto ab = operands();
  const at::Tensor& a = ab.a;
  const at::Tensor& b = ab.b;
  const at::Tensor expected = a.mm(b);
  Recorder recorder;
  at::Tensor y;
  {
    sac::detail::InterceptorGuard guard(&recorder);
    EXPECT_EQ(sac::detail::active_interceptor(), &recorder);
    y = a.mm(b);
  }
  EXPECT_EQ(count_of(recorder.names, "aten::mm"), 1u);
  ASSERT_TRUE(y.grad_fn() != nullptr) << "autograd did not run above the interceptor";
  EXPECT_EQ(y.grad_fn()->name(), "MmBackward0");
  EXPECT_TRUE(torch::equal(y, expected));
}

TEST_F(DispatchTest, NothingIsRecordedWithoutAnActiveInterceptor) {
  const auto ab = operands();
  const at::Tensor& a = ab.a;
  const at::Tensor& b = ab.b;
  Recorder recorder;
  { sac::detail::InterceptorGuard guard(&recorder); }
  a.mm(b).add(1);
  EXPECT_TRUE(recorder.names.empty());
  EXPECT_EQ(sac::detail::active_interceptor(), nullptr);
}

TEST_F(DispatchTest, PushAndPopInterceptor) {
  const auto ab = operands();
  const at::Tensor& a = ab.a;
  const at::Tensor& b = ab.b;
  Recorder recorder;
  const auto token = sac::detail::push_interceptor(&recorder);
  EXPECT_EQ(token.previous, nullptr);
  EXPECT_EQ(sac::detail::active_interceptor(), &recorder);
  a.mm(b);
  sac::detail::pop_interceptor(token);
  EXPECT_EQ(sac::detail::active_interceptor(), nullptr);
  a.mm(b);
  EXPECT_EQ(count_of(recorder.names, "aten::mm"), 1u);
}

// Calls aten::add on its first argument while it handles an op, and looks at
// the active interceptor from inside.
class NestingRecorder : public sac::detail::OpInterceptor {
 public:
  void intercept(const c10::OperatorHandle& op, c10::DispatchKeySet below,
                 torch::jit::Stack* stack) override {
    names.push_back(c10::toString(op.operator_name()));
    active_inside.push_back(sac::detail::active_interceptor());
    const auto args = torch::jit::last(*stack, op.schema().arguments().size());
    if (!args.empty() && args[0].isTensor()) {
      nested_sum = at::add(args[0].toTensor(), args[0].toTensor());
    }
    sac::detail::run_op(op, below, stack);
  }
  std::vector<std::string> names;
  std::vector<sac::detail::OpInterceptor*> active_inside;
  at::Tensor nested_sum;
};

TEST_F(DispatchTest, InterceptionIsSuspendedWhileAnInterceptorRuns) {
  const auto ab = operands();
  const at::Tensor& a = ab.a;
  const at::Tensor& b = ab.b;
  NestingRecorder recorder;
  at::Tensor y;
  {
    sac::detail::InterceptorGuard guard(&recorder);
    y = a.mm(b);
    EXPECT_EQ(sac::detail::active_interceptor(), &recorder);
  }
  EXPECT_EQ(count_of(recorder.names, "aten::mm"), 1u);
  EXPECT_EQ(count_of(recorder.names, "aten::add.Tensor"), 0u)
      << "the interceptor's own aten::add was intercepted";
  ASSERT_FALSE(recorder.active_inside.empty());
  for (auto* active : recorder.active_inside) {
    EXPECT_EQ(active, nullptr);
  }
  ASSERT_TRUE(recorder.nested_sum.defined());
  EXPECT_TRUE(torch::equal(recorder.nested_sum, a + a));
  EXPECT_TRUE(torch::equal(y, a.mm(b)));
}

TEST_F(DispatchTest, InterceptionResumesAfterTheInterceptorReturns) {
  const auto ab = operands();
  const at::Tensor& a = ab.a;
  const at::Tensor& b = ab.b;
  NestingRecorder recorder;
  {
    sac::detail::InterceptorGuard guard(&recorder);
    a.mm(b);
    a.add(a);
  }
  // The add outside intercept() is seen.
  EXPECT_EQ(count_of(recorder.names, "aten::mm"), 1u);
  EXPECT_EQ(count_of(recorder.names, "aten::add.Tensor"), 1u);
}

TEST_F(DispatchTest, InnerGuardHidesOuterOne) {
  const auto ab = operands();
  const at::Tensor& a = ab.a;
  const at::Tensor& b = ab.b;
  Recorder outer, inner;
  {
    sac::detail::InterceptorGuard outer_guard(&outer);
    {
      sac::detail::InterceptorGuard inner_guard(&inner);
      EXPECT_EQ(sac::detail::active_interceptor(), &inner);
      a.mm(b);
    }
    EXPECT_EQ(sac::detail::active_interceptor(), &outer);
    EXPECT_EQ(count_of(inner.names, "aten::mm"), 1u);
    EXPECT_EQ(count_of(outer.names, "aten::mm"), 0u);
    a.mm(b);
    EXPECT_EQ(count_of(inner.names, "aten::mm"), 1u);
    EXPECT_EQ(count_of(outer.names, "aten::mm"), 1u);
  }
  EXPECT_EQ(sac::detail::active_interceptor(), nullptr);
  a.mm(b);
  EXPECT_EQ(count_of(inner.names, "aten::mm"), 1u);
  EXPECT_EQ(count_of(outer.names, "aten::mm"), 1u);
}

// ---- Exceptions ------------------------------------------------------------------

class Throwing : public sac::detail::OpInterceptor {
 public:
  void intercept(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack*) override {
    ++calls;
    TORCH_CHECK(false, "interceptor refuses ", op.operator_name());
  }
  int calls = 0;
};

TEST_F(DispatchTest, ExceptionFromInterceptorPropagatesAndLeaksNoState) {
  const auto ab = operands();
  const at::Tensor& a = ab.a;
  const at::Tensor& b = ab.b;
  Throwing thrower;
  {
    sac::detail::InterceptorGuard guard(&thrower);
    const auto msg = error_of([&] { a.mm(b); });
    EXPECT_TRUE(contains(msg, "interceptor refuses aten::mm")) << msg;
    // The suspension ended with the exception: the interceptor is active again.
    EXPECT_EQ(sac::detail::active_interceptor(), &thrower);
  }
  EXPECT_EQ(thrower.calls, 1);
  EXPECT_EQ(sac::detail::active_interceptor(), nullptr);
  EXPECT_FALSE(c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::Fake));
  at::Tensor y;
  ASSERT_NO_THROW(y = a.mm(b));
  EXPECT_EQ(thrower.calls, 1) << "intercepted after its guard was gone";
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{3, 2}));
  // A new interceptor works as before.
  Recorder recorder;
  {
    sac::detail::InterceptorGuard guard(&recorder);
    a.mm(b);
  }
  EXPECT_EQ(count_of(recorder.names, "aten::mm"), 1u);
}

// ---- Per-op kernels --------------------------------------------------------------

TEST_F(DispatchTest, PerOpRefusesOpsWithLibTorchInplaceOrViewKernel) {
  if (sac::dispatch::mechanism() != Mechanism::PerOpKernels) {
    GTEST_SKIP() << "intercept_ops registers nothing (and so refuses nothing) with the "
                    "fallback-key mechanism";
  }
  const std::vector<c10::OperatorHandle> ops{op_of("aten::add_", "Tensor")};
  const auto msg = error_of([&] { sac::detail::intercept_ops(ops); });
  EXPECT_TRUE(contains(msg, "cannot intercept aten::add_.Tensor")) << msg;
  EXPECT_TRUE(contains(msg, "LibTorch registers its own ADInplaceOrView kernel")) << msg;
  EXPECT_TRUE(contains(msg, "sac never replaces a LibTorch kernel")) << msg;
  // LibTorch's kernel is still in place.
  auto x = torch::zeros({2});
  const auto version = x._version();
  x.add_(1);
  EXPECT_EQ(x._version(), version + 1);
}

TEST_F(DispatchTest, InterceptOpsIsIdempotent) {
  const std::vector<c10::OperatorHandle> ops{op_of("aten::mm")};
  EXPECT_NO_THROW(sac::detail::intercept_ops(ops));
  EXPECT_NO_THROW(sac::detail::intercept_ops(ops));
  const auto ab = operands();
  const at::Tensor& a = ab.a;
  const at::Tensor& b = ab.b;
  Recorder recorder;
  {
    sac::detail::InterceptorGuard guard(&recorder);
    a.mm(b);
  }
  EXPECT_EQ(count_of(recorder.names, "aten::mm"), 1u);
}

// ---- SAC_DISPATCH ----------------------------------------------------------------

// Runs this binary again with SAC_DISPATCH=bogus, only the test that checks
// the configured mechanism: it must fail with sac's message.
TEST_F(DispatchTest, BadSacDispatchValueIsReported) {
  char self[4096];
  const ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (length <= 0) {
    GTEST_SKIP() << "cannot find this test binary (no /proc/self/exe)";
  }
  self[length] = '\0';
  // The child must not write this run's reports, nor be sharded away.
  const std::string command =
      "env -u GTEST_OUTPUT -u XML_OUTPUT_FILE -u GTEST_SHARD_INDEX -u GTEST_TOTAL_SHARDS "
      "-u GTEST_SHARD_STATUS_FILE -u TEST_PREMATURE_EXIT_FILE SAC_DISPATCH=bogus '" +
      std::string(self) + "' --gtest_filter=DispatchTest.MechanismMatchesSacDispatch 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr) << command;
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) {
    output.append(buffer, n);
  }
  const int status = pclose(pipe);
  ASSERT_TRUE(WIFEXITED(status)) << output;
  EXPECT_NE(WEXITSTATUS(status), 0) << output;
  EXPECT_TRUE(contains(output, "SAC_DISPATCH='bogus' is not a dispatch mechanism")) << output;
  EXPECT_TRUE(contains(output, "Use per_op")) << output;
}

// ---- What each mechanism sees ----------------------------------------------------

// LibTorch's torch:: factory functions dispatch with ADInplaceOrView
// excluded: per-op kernels never see those calls, the fallback key does.
// The ops they reach are exactly those per_op_kernels_miss names.
TEST(DispatchBlindSpots, TorchFactoryCallsAreMissedByPerOpKernelsOnly) {
  sac_test::expect_configured_mechanism();
  auto x = torch::randn({2, 3});
  const std::vector<std::pair<std::string, std::function<void()>>> factories{
      {"aten::zeros", [] { torch::zeros({2}); }},
      {"aten::ones", [] { torch::ones({2}); }},
      {"aten::full", [] { torch::full({2}, 3.0); }},
      {"aten::empty", [] { torch::empty({2}); }},
      {"aten::empty_strided", [] { torch::empty_strided({2}, {1}); }},
      {"aten::arange", [] { torch::arange(4); }},
      {"aten::linspace", [] { torch::linspace(0, 1, 3); }},
      {"aten::eye", [] { torch::eye(2); }},
      {"aten::rand", [] { torch::rand({2}); }},
      {"aten::randn", [] { torch::randn({2}); }},
      {"aten::randint", [] { torch::randint(5, {2}); }},
      {"aten::randperm", [] { torch::randperm(4); }},
      {"aten::zeros_like", [&] { torch::zeros_like(x); }},
      {"aten::ones_like", [&] { torch::ones_like(x); }},
      {"aten::full_like", [&] { torch::full_like(x, 2.0); }},
      {"aten::empty_like", [&] { torch::empty_like(x); }},
      {"aten::rand_like", [&] { torch::rand_like(x); }},
      {"aten::randn_like", [&] { torch::randn_like(x); }},
      {"aten::randint_like", [&] { torch::randint_like(x, 5); }},
  };
  // Ops the same code reaches through other paths, which both mechanisms see.
  const std::vector<std::pair<std::string, std::function<void()>>> others{
      {"aten::zeros", [] { at::zeros({2}); }},
      {"aten::arange", [] { at::arange(4); }},
      {"aten::_to_copy", [&] { x.to(torch::kFloat64); }},
      {"aten::mul", [&] { torch::mul(x, 2.0); }},
  };
  const bool per_op = sac::dispatch::mechanism() == Mechanism::PerOpKernels;
  sac::detail::intercept_ops_matching(
      [](const c10::OperatorHandle& op) { return sac::detail::per_op_kernels_miss(op); });
  sac::detail::intercept_ops({op_of("aten::_to_copy"), op_of("aten::mul", "Scalar")});
  auto seen = [](const std::function<void()>& call) {
    Recorder recorder;
    {
      sac::detail::InterceptorGuard guard(&recorder);
      call();
    }
    std::vector<std::string> names;
    for (const auto& name : recorder.names) names.push_back(name.substr(0, name.find('.')));
    return names;
  };
  for (const auto& [name, call] : factories) {
    SCOPED_TRACE(name);
    const auto names = seen(call);
    EXPECT_EQ(count_of(names, name), per_op ? 0u : 1u);
    for (const auto& op : sac::detail::resolve_op_name(name + ".*")) {
      if (op.schema().is_mutable()) continue;  // out= overloads: never cacheable
      EXPECT_TRUE(sac::detail::per_op_kernels_miss(op)) << c10::toString(op.operator_name());
      EXPECT_EQ(sac::detail::mechanism_misses(op), per_op);
    }
  }
  for (const auto& [name, call] : others) {
    SCOPED_TRACE(name);
    EXPECT_EQ(count_of(seen(call), name), 1u);
  }
  for (const char* name : {"aten::_to_copy", "aten::mul", "aten::mm", "aten::index_select"}) {
    for (const auto& op : sac::detail::resolve_op_name(std::string(name) + ".*")) {
      EXPECT_FALSE(sac::detail::per_op_kernels_miss(op)) << c10::toString(op.operator_name());
    }
  }
}

}  // namespace dispatch_test
