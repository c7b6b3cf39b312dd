// Changes, on purpose, one c10 internal that tests/contract_test.cpp guards
// (SAC_MUTANT=fake_key, memory_reports, factory_ops, functional_collectives,
// hooks_state, engine_stub or raw_key_set), preloaded into the test binary:
// tools/contract_mutants/run.sh checks that each makes its contract test
// fail. Registrations and allocators where c10 has an API for them;
// interposed symbols (dlsym RTLD_NEXT) where it has not.
#include <ATen/SavedTensorHooks.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/library.h>

#include <dlfcn.h>
#include <cstdlib>
#include <cstring>
#include <optional>

namespace {
bool mutant(const char* name) {
  const char* m = std::getenv("SAC_MUTANT");
  return m != nullptr && std::strcmp(m, name) == 0;
}

// A CPU allocator that reports nothing to c10's profiler slot.
struct Silent final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    void* p = std::malloc(n == 0 ? 1 : n);
    return {p, p, &std::free, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &std::free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

struct Install {
  Install() {
    if (mutant("fake_key")) {
      static auto handle = c10::Dispatcher::singleton().registerFallback(
          c10::DispatchKey::Fake, c10::KernelFunction::makeFallthrough(), "mutant");
    }
    if (mutant("memory_reports")) {
      static Silent silent;
      c10::SetCPUAllocator(&silent, /*priority=*/127);
    }
  }
} install;
}  // namespace

TORCH_LIBRARY_FRAGMENT(aten, m) {
  if (mutant("factory_ops")) {
    m.def("sac_mutant_ones(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, "
          "Device? device=None, bool? pin_memory=None) -> Tensor");
  }
}
TORCH_LIBRARY_FRAGMENT(_c10d_functional, m) {
  if (mutant("functional_collectives")) {
    m.def("all_reduce.mutant(Tensor input, str reduce_op, str group_name) -> Tensor");
  }
}

// Interposed: a state write that drops the disabled message.
namespace at {
void SavedTensorDefaultHooks::set_tls_state(const impl::SavedTensorDefaultHooksTLS& tls) {
  using Fn = void (*)(const impl::SavedTensorDefaultHooksTLS&);
  static Fn real = reinterpret_cast<Fn>(dlsym(
      RTLD_NEXT,
      "_ZN2at23SavedTensorDefaultHooks13set_tls_stateERKNS_4impl26SavedTensorDefaultHooksTLSE"));
  if (mutant("hooks_state")) {
    impl::SavedTensorDefaultHooksTLS changed = tls;
    changed.disabled_error_message.reset();
    real(changed);
    return;
  }
  real(tls);
}
}  // namespace at

// Interposed: an engine stub that is never installed.
namespace torch::autograd {
void set_default_engine_stub(EngineStub stub) {
  using Fn = void (*)(EngineStub);
  static Fn real = reinterpret_cast<Fn>(
      dlsym(RTLD_NEXT, "_ZN5torch8autograd23set_default_engine_stubEPFRNS0_6EngineEvE"));
  if (mutant("engine_stub")) {
    return;
  }
  real(stub);
}
}  // namespace torch::autograd

// Interposed: c10's guard writes a key set of its own, not the raw one.
namespace c10::impl {
IncludeDispatchKeyGuard::IncludeDispatchKeyGuard(DispatchKeySet include)
    : tls_(&raw_local_dispatch_key_set), saved_state_(include - tls_->included()) {
  if (mutant("raw_key_set")) {
    static thread_local PODLocalDispatchKeySet elsewhere{};
    tls_ = &elsewhere;
    saved_state_ = include - elsewhere.included();
  }
  tls_->set_included(tls_->included() | include);
}
}  // namespace c10::impl
