// The c10 contract (docs/c10-contract.md): each internal of c10, ATen and
// torch's autograd that sac leans on beyond their public API, one test each.
// A release that changes one fails here, loudly and by the item's name,
// before it fails somewhere in sac's behaviour (or silently). CI runs these
// against every torch release it covers.
#include "tests/support.h"

#include <sac/base/internal/saved_tensor_hooks.h>
#include <sac/base/internal/version_watch.h>
#include <sac/dispatch/internal/registry.h>
#include <sac/dispatch/internal/factory_ops.h>
#include <sac/dispatch/mechanism.h>
#include <sac/sac.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/SavedTensorHooks.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/autograd/engine.h>

#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

// Each failure names its item, as docs/c10-contract.md does.
#define CONTRACT(item) "c10 contract, \"" item "\" (docs/c10-contract.md): "

std::vector<c10::FunctionSchema> schemas_of(const std::string& name) {
  std::vector<c10::FunctionSchema> out;
  for (const c10::OperatorName& op : c10::Dispatcher::singleton().getAllOpNames()) {
    if (op.name == name) {
      out.push_back(c10::Dispatcher::singleton()
                        .findSchemaOrThrow(op.name.c_str(), op.overload_name.c_str())
                        .schema());
    }
  }
  return out;
}

bool has_argument(const c10::FunctionSchema& schema, const std::string& name) {
  for (const auto& argument : schema.arguments()) {
    if (argument.name() == name) {
      return true;
    }
  }
  return false;
}

TEST(C10Contract, FakeKeyIsFree) {
  // sac's fallback takes DispatchKey::Fake (c10 reserves it "for C++
  // FakeTensor mode"): nothing else may have a fallback or a kernel there.
  std::string reason;
  EXPECT_TRUE(sac::detail::fallback_key_available(&reason)) << CONTRACT("Fake key") << reason;
  EXPECT_TRUE(
      c10::Dispatcher::singleton().getAllOpNamesForDispatchKey(c10::DispatchKey::Fake).empty())
      << CONTRACT("Fake key") << "ops have kernels on DispatchKey::Fake";
  // Below autograd and ADInplaceOrView, so that an intercepted call is one
  // autograd has recorded already.
  EXPECT_LT(c10::DispatchKeySet(c10::DispatchKey::Fake).highestPriorityTypeId(),
            c10::DispatchKey::ADInplaceOrView)
      << CONTRACT("Fake key") << "Fake is no longer below ADInplaceOrView";
}

TEST(C10Contract, FakeKeyTakenIsAClearError) {
  // Another library's fallback on the key: sac's fallback mechanism is
  // refused with the reason and the way out, never registered beside it.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        static auto other = c10::Dispatcher::singleton().registerFallback(
            c10::DispatchKey::Fake, c10::KernelFunction::makeFallthrough(), "another library");
        setenv("SAC_DISPATCH", "fallback", 1);
        try {
          sac::dispatch::mechanism();
        } catch (const c10::Error& e) {
          const std::string message = e.what_without_backtrace();
          std::exit(message.find("already registers a fallback on DispatchKey::Fake") !=
                                std::string::npos &&
                            message.find("SAC_DISPATCH=per_op") != std::string::npos
                        ? 0
                        : 2);
        }
        std::exit(1);
      },
      testing::ExitedWithCode(0), "")
      << CONTRACT("Fake key") << "a taken key must refuse the fallback mechanism clearly";
}

TEST(C10Contract, InfraModeKeysAreTracers) {
  // The region refuses a trace when any infra dispatch mode is set
  // (sac/record/recorder.cpp): FAKE, PROXY and FUNCTIONAL are a tracer's.
  // A new key is taken for one too; this says to check that it is.
  EXPECT_EQ(static_cast<int>(c10::impl::TorchDispatchModeKey::NUM_MODE_KEYS), 3)
      << CONTRACT("Infra mode keys")
      << "c10 has a new infra mode key: decide whether a region under it is a trace";
}

TEST(C10Contract, FactoryOpsMatchTheRegisteredSchemas) {
  // Ops with an overload taking all of TensorOptions and no tensor, and the
  // *_like ops: the factory functions torchgen writes for torch::. Each must
  // be one per-op kernels know they miss (sac/dispatch/factory_ops.cpp);
  // every one listed there must still exist, with a `dtype` overload.
  // Not factory functions: ops whose TensorOptions are only a method's.
  const std::set<std::string> methods_only{"aten::new_empty", "aten::new_empty_strided",
                                           "aten::new_full", "aten::new_ones", "aten::new_zeros"};
  std::set<std::string> factories;
  std::set<std::string> with_dtype;
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) {
      continue;
    }
    const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name.name.c_str(),
                                                                   name.overload_name.c_str());
    const c10::FunctionSchema& schema = op.schema();
    if (!has_argument(schema, "dtype")) {
      continue;
    }
    with_dtype.insert(name.name);
    if (!has_argument(schema, "layout") || !has_argument(schema, "device") ||
        !has_argument(schema, "pin_memory") || schema.is_mutable()) {
      continue;
    }
    bool takes_a_tensor = false;
    for (const auto& argument : schema.arguments()) {
      // Tensor, Tensor?, Tensor[]: any argument that holds one.
      takes_a_tensor = takes_a_tensor || argument.type()->str().find("Tensor") != std::string::npos;
    }
    const bool like = name.name.size() > 5 && name.name.substr(name.name.size() - 5) == "_like";
    if ((like || !takes_a_tensor) && methods_only.count(name.name) == 0) {
      if (!sac::detail::per_op_kernels_miss(op)) {
        ADD_FAILURE() << CONTRACT("Factory ops") << name.name << "." << name.overload_name
                      << " takes TensorOptions: add it to sac/dispatch/factory_ops.cpp";
      }
      factories.insert(name.name);
    }
  }
  EXPECT_GT(factories.size(), 30u) << CONTRACT("Factory ops") << "the rule found too few";
  for (const char* listed : sac::detail::listed_factory_ops()) {
    EXPECT_TRUE(with_dtype.count(listed) == 1)
        << CONTRACT("Factory ops") << listed
        << " is listed in sac/dispatch/factory_ops.cpp but has no overload with a dtype";
  }
}

TEST(C10Contract, FunctionalCollectivesTakeWhatSacPasses) {
  // sac and its examples call these boxed with these arguments, in order;
  // a string or int where the schema says `str`, `int` or `Any`.
  const std::vector<std::pair<std::string, std::vector<std::string>>> calls{
      {"_c10d_functional::all_reduce", {"input", "reduce_op", "group_name"}},
      {"_c10d_functional::all_gather_into_tensor", {"input", "group_size", "group_name"}},
      {"_c10d_functional::reduce_scatter_tensor",
       {"input", "reduce_op", "group_size", "group_name"}},
      {"_c10d_functional::wait_tensor", {"tensor"}}};
  for (const auto& [name, arguments] : calls) {
    const auto schemas = schemas_of(name);
    ASSERT_EQ(schemas.size(), 1u) << CONTRACT("Functional collectives") << name;
    const auto& got = schemas.front().arguments();
    ASSERT_EQ(got.size(), arguments.size())
        << CONTRACT("Functional collectives") << schemas.front();
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].name(), arguments[i])
          << CONTRACT("Functional collectives") << schemas.front();
      if (i > 0) {
        const auto kind = got[i].type()->kind();
        EXPECT_TRUE(kind == c10::TypeKind::StringType || kind == c10::TypeKind::IntType ||
                    kind == c10::TypeKind::AnyType)
            << CONTRACT("Functional collectives") << schemas.front();
      }
    }
  }
}

TEST(C10Contract, SavedTensorHooksStateKeepsWhatTheBridgeSetsAside) {
  // The Python bridge hides torch's stack of saved-tensor hooks by reading
  // the thread's state, emptying `stack` and writing the state back
  // (python/csrc/hooks_bridge.cpp): the other fields must survive that.
  at::SavedTensorDefaultHooks::disable("sac contract test");
  at::impl::SavedTensorDefaultHooksTLS state = at::SavedTensorDefaultHooks::get_tls_state();
  state.stack = {};
  at::SavedTensorDefaultHooks::set_tls_state(state);
  const bool kept = at::SavedTensorDefaultHooks::get_disabled_error_message() ==
                    std::optional<std::string>("sac contract test");
  at::SavedTensorDefaultHooks::enable();
  EXPECT_TRUE(kept) << CONTRACT("Saved-tensor hooks state")
                    << "the state's other fields did not survive a write of its stack";
  EXPECT_FALSE(at::SavedTensorDefaultHooks::get_hooks().has_value())
      << CONTRACT("Saved-tensor hooks state") << "an empty stack still gives hooks";
  static_assert(std::is_same_v<decltype(at::impl::SavedTensorDefaultHooksTLS::stack),
                               std::stack<std::pair<c10::SafePyObject, c10::SafePyObject>>>,
                "c10 contract, \"Saved-tensor hooks state\": the stack's type changed");
}

// Counts what c10 reports to the thread's profiler slot.
struct Reports final : c10::MemoryReportingInfoBase {
  bool memoryProfilingEnabled() const override { return true; }
  void reportMemoryUsage(void*, int64_t bytes, size_t, size_t, c10::Device) override {
    (bytes > 0 ? allocated : freed) += bytes;
  }
  int64_t allocated = 0;
  int64_t freed = 0;
};

TEST(C10Contract, MemoryReportsReachTheProfilerSlot) {
  // measure_step_phases records the step through the PROFILER_STATE slot
  // of c10's ThreadLocalDebugInfo (sac/lab/step_trace.cpp).
  auto reports = std::make_shared<Reports>();
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, reports);
    at::Tensor t = at::empty({256}, at::kFloat);
  }
  EXPECT_EQ(reports->allocated, 1024)
      << CONTRACT("Memory reports") << "the CPU allocator's allocation was not reported";
  EXPECT_EQ(reports->freed, -1024)
      << CONTRACT("Memory reports") << "the CPU allocator's free was not reported";
}

TEST(C10Contract, VersionCounterIsOneSharedPointer) {
  // sac reads a VariableVersion's identity by copying its one pointer
  // (sac/base/internal/version_watch.h): shared by a tensor and its views,
  // distinct for another tensor, stable.
  at::Tensor a = torch::ones({4});
  at::Tensor view = a.narrow(0, 1, 2);
  at::Tensor other = torch::ones({4});
  const void* identity =
      sac::detail::version_counter_identity(a.unsafeGetTensorImpl()->version_counter());
  EXPECT_NE(identity, nullptr) << CONTRACT("Version counter");
  EXPECT_EQ(identity,
            sac::detail::version_counter_identity(view.unsafeGetTensorImpl()->version_counter()))
      << CONTRACT("Version counter") << "a view's counter reads as another";
  EXPECT_NE(identity,
            sac::detail::version_counter_identity(other.unsafeGetTensorImpl()->version_counter()))
      << CONTRACT("Version counter") << "two tensors' counters read as one";
  view.add_(1);
  EXPECT_EQ(identity,
            sac::detail::version_counter_identity(a.unsafeGetTensorImpl()->version_counter()))
      << CONTRACT("Version counter") << "a bump moved the identity";
  EXPECT_EQ(a._version(), 1) << CONTRACT("Version counter");
}

// Tells whether the engine asked for saved-variable hooks.
struct Packs final : torch::autograd::SavedVariableHooks {
  explicit Packs(int* count) : count_(count) {}
  void call_pack_hook(const at::Tensor& tensor) override {
    ++*count_;
    tensor_ = tensor;
  }
  at::Tensor call_unpack_hook() override { return tensor_; }
  int* count_;
  at::Tensor tensor_;
};

TEST(C10Contract, EngineStubGivesSavedVariablesSacsHooks) {
  // sac replaces the default engine, once per process, with one that answers
  // get_default_saved_variable_hooks (sac/base/saved_tensor_hooks.cpp); a
  // SavedVariable asks the default engine when it is made.
  try {
    sac::detail::install_hooking_engine();
  } catch (const c10::Error& e) {
    FAIL() << CONTRACT("Engine stub") << e.what_without_backtrace();
  }
  int packs = 0;
  at::Tensor x = torch::ones({3}, torch::requires_grad());
  at::Tensor y;
  {
    sac::detail::SavedTensorHooksGuard hooks([&] { return std::make_unique<Packs>(&packs); });
    y = (x * x).sum();
  }
  EXPECT_NE(&torch::autograd::Engine::get_default_engine(),
            &torch::autograd::Engine::get_base_engine())
      << CONTRACT("Engine stub") << "sac's engine is not the default";
  EXPECT_EQ(packs, 2) << CONTRACT("Engine stub") << "mul's two saved inputs were not packed";
  y.backward();
  EXPECT_TRUE(torch::equal(x.grad(), torch::full({3}, 2.0))) << CONTRACT("Engine stub");
}

TEST(C10Contract, ViewGradFnIsRebuiltOnDemand) {
  // sac tells a view whose grad_fn autograd will rebuild (its base modified
  // in place since) by its DifferentiableViewMeta's attr_version
  // (grad_fn_is_stale, sac/base/saved_tensor_hooks.cpp), and saves such a
  // checkpoint argument without hooks, because a SavedVariable made under
  // hooks asks for the grad_fn and so rebuilds it early (Note [Saving a
  // stale view]).
  sac::detail::install_hooking_engine();
  at::Tensor base = torch::ones({2, 3}, torch::requires_grad()) * 2;
  at::Tensor view = base.view({3, 2});
  const uint64_t made = view.grad_fn()->sequence_nr();
  EXPECT_FALSE(sac::detail::grad_fn_is_stale(view)) << CONTRACT("View grad_fn rebuilt on demand");
  base.exp_();
  EXPECT_TRUE(sac::detail::grad_fn_is_stale(view))
      << CONTRACT("View grad_fn rebuilt on demand") << "an in-place op on the base went unseen";
  int packs = 0;
  {
    sac::detail::SavedTensorHooksGuard hooks([&] { return std::make_unique<Packs>(&packs); });
    const torch::autograd::SavedVariable saved(view, /*is_output=*/false);
  }
  EXPECT_EQ(packs, 1) << CONTRACT("View grad_fn rebuilt on demand");
  EXPECT_FALSE(sac::detail::grad_fn_is_stale(view))
      << CONTRACT("View grad_fn rebuilt on demand")
      << "a SavedVariable made under hooks no longer rebuilds the grad_fn of the view it saves";
  EXPECT_GT(view.grad_fn()->sequence_nr(), made)
      << CONTRACT("View grad_fn rebuilt on demand") << "the rebuilt node was not numbered anew";
  // save_input packs it once too, but makes the SavedVariable without the
  // thread's hooks: its grad_fn is not asked for.
  base.exp_();
  {
    sac::detail::SavedTensorHooksGuard hooks([&] { return std::make_unique<Packs>(&packs); });
    const torch::autograd::SavedVariable saved = sac::detail::save_input(view);
  }
  EXPECT_EQ(packs, 2) << CONTRACT("View grad_fn rebuilt on demand");
  EXPECT_TRUE(sac::detail::grad_fn_is_stale(view)) << CONTRACT("View grad_fn rebuilt on demand");
}

TEST(C10Contract, RawKeySetIsTheThreadsKeySet) {
  // The fallback key is flipped through c10::impl::raw_local_dispatch_key_set
  // (Note [Writing c10's key set in place], sac/dispatch/interceptor.cpp):
  // it must be the variable c10's own API reads and writes, per thread.
  const auto before = c10::impl::tls_local_dispatch_key_set();
  {
    c10::impl::IncludeDispatchKeyGuard include(c10::DispatchKey::Fake);
    EXPECT_TRUE(c10::impl::raw_local_dispatch_key_set.included().has(c10::DispatchKey::Fake))
        << CONTRACT("Raw key set") << "c10's guard does not write the raw set";
    bool other_thread_sees_it = true;
    std::thread([&] {
      other_thread_sees_it =
          c10::impl::raw_local_dispatch_key_set.included().has(c10::DispatchKey::Fake);
    }).join();
    EXPECT_FALSE(other_thread_sees_it) << CONTRACT("Raw key set") << "not thread-local";
  }
  c10::impl::raw_local_dispatch_key_set.set_included(
      c10::impl::raw_local_dispatch_key_set.included().add(c10::DispatchKey::Fake));
  const bool seen = c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::Fake);
  c10::impl::raw_local_dispatch_key_set.set_included(before.included_);
  EXPECT_TRUE(seen) << CONTRACT("Raw key set") << "c10's API does not read the raw set";
}

#undef CONTRACT

}  // namespace
