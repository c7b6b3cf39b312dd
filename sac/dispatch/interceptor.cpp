#include <sac/dispatch/internal/interceptor.h>

#include <sac/dispatch/internal/boxed.h>
#include <sac/dispatch/internal/carried.h>
#include <sac/dispatch/internal/placement.h>

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace sac::dispatch {
namespace {

constexpr c10::DispatchKey kFallbackKey = c10::DispatchKey::Fake;
constexpr c10::DispatchKey kPerOpKey = c10::DispatchKey::ADInplaceOrView;

// The thread's interception state. `observing` caches "observers is not
// empty and not suspended", so the hot path reads one struct. `shielded`:
// interception is suspended or isolated here, so what a backward call
// carried to this thread (below) does not apply either.
struct ThreadState {
  OpInterceptor* interceptor = nullptr;
  bool observing = false;
  bool shielded = false;
  // c10's key sets of this thread, found once (Note [Writing c10's key set in place]).
  c10::impl::PODLocalDispatchKeySet* keys = nullptr;
};
thread_local ThreadState tls_state;
thread_local std::vector<OpObserver*> tls_observers;

// The interceptor and observers of a thread that called backward, seen by
// every thread that runs the backward's nodes (sac/dispatch/internal/carried.h). Those
// threads may run at once, and the interceptor and observers are not
// thread-safe: ops through them take turns.
struct Carried {
  Carried(OpInterceptor* interceptor, std::vector<OpObserver*> observers)
      : interceptor(interceptor), observers(std::move(observers)) {}
  OpInterceptor* const interceptor;
  const std::vector<OpObserver*> observers;
  std::recursive_mutex mutex;
};
constexpr std::string_view kCarriedName = "sac::dispatch::Carried";
const c10::DebugInfoKind kCarriedSlot(&kCarriedName);

// An empty snapshot masks the ones below it: a backward called where
// interception is isolated carries nothing.
Carried* carried_to(const ThreadState& state) {
  if (state.shielded) {
    return nullptr;
  }
  Carried* carried = detail::carried<Carried>(kCarriedSlot);
  return carried == nullptr || (carried->interceptor == nullptr && carried->observers.empty())
             ? nullptr
             : carried;
}

// Set once sac's own fallback is registered on kFallbackKey.
std::atomic<bool> our_fallback_registered{false};

// The fallback key is in the thread's included key set exactly while
// something on the thread wants to see ops and the fallback mechanism is in
// use. Called when that may change, never per op.
void sync_fallback_key(const ThreadState& state) {
  const bool wanted =
      our_fallback_registered.load(std::memory_order_relaxed) &&
      (state.interceptor != nullptr || state.observing || carried_to(state) != nullptr);
  if (c10::impl::tls_is_dispatch_key_included(kFallbackKey) != wanted) {
    c10::impl::tls_set_dispatch_key_included(kFallbackKey, wanted);
  }
}

// Note [Writing c10's key set in place]
// c10's API for the thread's key set (c10::impl::tls_set_dispatch_key_included,
// IncludeDispatchKeyGuard) finds the thread-local set anew on each call, from
// another library: a call to __tls_get_addr and one to c10. The fallback key
// is taken out and put back twice per intercepted op, so sac finds the set
// once per thread (c10::impl::raw_local_dispatch_key_set, the variable that
// API writes, declared in c10/core/impl/LocalDispatchKeySet.h) and flips the
// bit through the pointer: part of what took an unlisted op from five TLS
// lookups over the floor to two (BENCHMARKS.md, "The dispatch path"). Where c10
// does not export that variable (MSVC, mobile builds) the API is used. Key
// sets changed only when interception starts or ends (sync_fallback_key) go
// through the API.

// Removes the fallback key from the thread's included set while alive, and
// puts it back (see Note [Writing c10's key set in place]).
class WithoutFallbackKey {
 public:
  explicit WithoutFallbackKey(ThreadState& state) {
#if !defined(_MSC_VER) && !defined(C10_ANDROID) && !defined(C10_IPHONE)
    if (state.keys == nullptr) {
      state.keys = &c10::impl::raw_local_dispatch_key_set;
    }
    keys_ = state.keys;
#endif
    set(false);
  }
  ~WithoutFallbackKey() { set(true); }
  WithoutFallbackKey(const WithoutFallbackKey&) = delete;
  WithoutFallbackKey& operator=(const WithoutFallbackKey&) = delete;

 private:
  void set(bool included) {
#if defined(_MSC_VER) || defined(C10_ANDROID) || defined(C10_IPHONE)
    c10::impl::tls_set_dispatch_key_included(kFallbackKey, included);
#else
    const c10::DispatchKeySet set = keys_->included();
    keys_->set_included(included ? set.add(kFallbackKey) : set.remove(kFallbackKey));
#endif
  }
  c10::impl::PODLocalDispatchKeySet* keys_ = nullptr;
};

// Hides the active interceptor and the observers (and the fallback key)
// while they handle an op, so that the ops they run, and the ops the real
// kernel runs inside, are not intercepted again.
class SuspendInterception {
 public:
  SuspendInterception(ThreadState& state, bool fallback_key_included)
      : state_(state), saved_(state) {
    state.interceptor = nullptr;
    state.observing = false;
    state.shielded = true;
    if (fallback_key_included) {
      without_key_.emplace(state);
    }
  }
  ~SuspendInterception() {
    state_.interceptor = saved_.interceptor;
    state_.observing = saved_.observing;
    state_.shielded = saved_.shielded;
  }
  SuspendInterception(const SuspendInterception&) = delete;
  SuspendInterception& operator=(const SuspendInterception&) = delete;

 private:
  ThreadState& state_;  // the thread's: looked up once per op
  const ThreadState saved_;
  std::optional<WithoutFallbackKey> without_key_;
};

// Shows an op's arguments (before) or outputs (after) to `observers`. Out of
// line: most ops have none.
[[gnu::noinline]] void show_before(const std::vector<OpObserver*>& observers,
                                   const ObservedOp& call, const torch::jit::Stack& stack) {
  const auto args = arguments_on(call.op, stack);
  for (OpObserver* observer : observers) {
    observer->before_op(call, args);
  }
}
[[gnu::noinline]] void show_after(const std::vector<OpObserver*>& observers, const ObservedOp& call,
                                  const torch::jit::Stack& stack) {
  const auto outputs = outputs_on(call.op, stack);
  for (OpObserver* observer : observers) {
    observer->after_op(call, outputs);
  }
}

// Handles one op for `interceptor` (or runs it) and shows it to `observers`
// (null: none). `state` is the thread's, found by the caller: noipa keeps the
// compiler from specializing this function for it and finding it again, a
// call each time.
template <c10::DispatchKey Key>
[[gnu::noipa]] void handle(ThreadState& state, const c10::OperatorHandle& op,
                           c10::DispatchKeySet below, torch::jit::Stack* stack,
                           OpInterceptor* interceptor, const std::vector<OpObserver*>* observers) {
  // Reaching the fallback means the key is included; per-op kernels run with
  // it excluded (sac includes it only under the fallback mechanism).
  SuspendInterception suspend(state, /*fallback_key_included=*/Key == kFallbackKey);
  const ObservedOp call{op, below, interceptor};
  if (observers != nullptr) {
    show_before(*observers, call, *stack);
  }
  if (interceptor != nullptr) {
    interceptor->intercept(op, below, stack);
  } else {
    op.redispatchBoxed(below, stack);
  }
  if (observers != nullptr) {
    show_after(*observers, call, *stack);
  }
}

// An op on a thread with nothing of its own active: what a backward call
// carried here handles it, or it just runs. Out of line: the kernel's
// common path stays short.
template <c10::DispatchKey Key>
[[gnu::noinline]] void handle_carried(ThreadState& state, const c10::OperatorHandle& op,
                                      c10::DispatchKeySet below, torch::jit::Stack* stack) {
  if (Carried* carried = carried_to(state)) {
    std::lock_guard<std::recursive_mutex> turn(carried->mutex);
    handle<Key>(state, op, below, stack, carried->interceptor,
                carried->observers.empty() ? nullptr : &carried->observers);
    return;
  }
  op.redispatchBoxed(below, stack);
}

// The one boxed kernel, placed at `Key` by either mechanism.
template <c10::DispatchKey Key>
void intercepting_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                         torch::jit::Stack* stack) {
  static constexpr c10::DispatchKeySet kBelow(c10::DispatchKeySet::FULL_AFTER, Key);
  const c10::DispatchKeySet below = ks & kBelow;
  ThreadState& tls = tls_state;
  const ThreadState state = tls;
  if (state.observing) {
    handle<Key>(tls, op, below, stack, state.interceptor, &tls_observers);
  } else if (state.interceptor != nullptr) {
    handle<Key>(tls, op, below, stack, state.interceptor, nullptr);
  } else {
    handle_carried<Key>(tls, op, below, stack);
  }
}

// Remembers ops defined after a filter was installed; they are registered
// at the next interceptor activation, because the dispatcher calls listeners
// under the lock that registerImpl takes.
class NewOpListener final : public c10::OpRegistrationListener {
 public:
  explicit NewOpListener(std::function<void(c10::OperatorName)> on_new)
      : on_new_(std::move(on_new)) {}
  void onOperatorRegistered(const c10::OperatorHandle& op) override { on_new_(op.operator_name()); }
  void onOperatorDeregistered(const c10::OperatorHandle&) override {}

 private:
  std::function<void(c10::OperatorName)> on_new_;
};

// Process-wide state. Leaked on purpose: the dispatcher may outlive any
// static destructor order we could choose.
class Registry {
 public:
  static Registry& get() {
    static Registry* registry = new Registry();
    return *registry;
  }

  Mechanism resolve() {
    std::lock_guard<std::mutex> lock(mutex_);
    return resolve_locked();
  }

  void set(std::optional<Mechanism> requested) {
    std::lock_guard<std::mutex> lock(mutex_);
    const Mechanism wanted = requested.has_value() ? *requested : automatic_locked();
    if (in_use_) {
      TORCH_CHECK(!mechanism_.has_value() || *mechanism_ == wanted,
                  "sac: cannot switch the dispatch mechanism to ", to_string(wanted), ": ",
                  to_string(*mechanism_),
                  " is already in use in this process. Choose the mechanism "
                  "before the first checkpoint (sac::dispatch::set_mechanism or "
                  "SAC_DISPATCH=per_op|fallback|auto).");
      return;
    }
    mechanism_.reset();
    adopt_locked(wanted, requested.has_value() ? "set_mechanism" : "auto");
  }

  void intercept(c10::ArrayRef<c10::OperatorHandle> ops) {
    std::lock_guard<std::mutex> lock(mutex_);
    in_use_ = true;
    if (resolve_locked() != Mechanism::PerOpKernels) {
      return;
    }
    for (const auto& op : ops) {
      register_kernel_locked(op);
    }
  }

  void intercept_matching(OpFilter filter) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      in_use_ = true;
      if (resolve_locked() != Mechanism::PerOpKernels ||
          std::find(filters_.begin(), filters_.end(), filter) != filters_.end()) {
        return;
      }
      filters_.push_back(filter);
    }
    // The dispatcher replays every existing op to a new listener, and calls
    // it under its own lock: added once, outside ours.
    bool added = false;
    std::call_once(listener_once_, [&] {
      listener_ = new c10::RegistrationHandleRAII(
          c10::Dispatcher::singleton().addRegistrationListener(std::make_unique<NewOpListener>(
              [this](c10::OperatorName name) { note_new_op(std::move(name)); })));
      added = true;
    });
    std::lock_guard<std::mutex> lock(mutex_);
    if (!added) {
      // Existing ops must be checked against the new filter too.
      for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
        pending_.push_back(name);
      }
    }
    register_pending_locked();
  }

  void on_activation() {
    if (has_pending_.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(mutex_);
      register_pending_locked();
    }
  }

  // The mechanism once something was intercepted, without a lock; else
  // nothing.
  std::optional<Mechanism> activated() const {
    if (activated_.load(std::memory_order_acquire)) {
      return *mechanism_;
    }
    return std::nullopt;
  }

  Mechanism activate() {
    // Fast path: the mechanism is fixed after the first activation.
    if (activated_.load(std::memory_order_acquire)) {
      on_activation();
      return *mechanism_;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    in_use_ = true;
    const Mechanism m = resolve_locked();
    activated_.store(true, std::memory_order_release);
    register_pending_locked();
    return m;
  }

 private:
  Registry() = default;

  Mechanism automatic_locked() const {
    return fallback_key_available(nullptr) ? Mechanism::FallbackKey : Mechanism::PerOpKernels;
  }

  Mechanism resolve_locked() {
    if (mechanism_.has_value()) {
      return *mechanism_;
    }
    const char* env = std::getenv("SAC_DISPATCH");
    const std::string value = env == nullptr ? "auto" : env;
    if (value == "per_op") {
      adopt_locked(Mechanism::PerOpKernels, "SAC_DISPATCH=per_op");
    } else if (value == "fallback") {
      adopt_locked(Mechanism::FallbackKey, "SAC_DISPATCH=fallback");
    } else if (value == "auto" || value.empty()) {
      adopt_locked(automatic_locked(), "auto");
    } else {
      TORCH_CHECK(false, "sac: SAC_DISPATCH='", value,
                  "' is not a dispatch mechanism. Use per_op (a kernel on "
                  "ADInplaceOrView for each needed op), fallback (one fallback "
                  "on the Fake key) or auto.");
    }
    return *mechanism_;
  }

  void adopt_locked(Mechanism m, const char* requested_by) {
    if (m == Mechanism::FallbackKey && !fallback_.has_value()) {
      std::string reason;
      TORCH_CHECK(fallback_key_available(&reason), "sac: ", requested_by,
                  " asks for the fallback-key dispatch mechanism, but ", reason,
                  ". Use the per-op mechanism instead (SAC_DISPATCH=per_op).");
      fallback_.emplace(c10::Dispatcher::singleton().registerFallback(
          kFallbackKey,
          c10::KernelFunction::makeFromBoxedFunction<&intercepting_kernel<kFallbackKey>>(),
          "sac: selective activation checkpointing (fallback below autograd)"));
      our_fallback_registered.store(true);
    }
    mechanism_ = m;
  }

  void note_new_op(c10::OperatorName name) {
    // Called by the dispatcher, possibly while this registry's mutex is held
    // by intercept_matching (which unlocks before adding the listener), so it
    // takes its own lock.
    std::lock_guard<std::mutex> lock(pending_mutex_);
    incoming_.push_back(std::move(name));
    has_pending_.store(true, std::memory_order_release);
  }

  void register_pending_locked() {
    {
      std::lock_guard<std::mutex> lock(pending_mutex_);
      for (auto& name : incoming_) {
        pending_.push_back(std::move(name));
      }
      incoming_.clear();
      has_pending_.store(false, std::memory_order_release);
    }
    auto& dispatcher = c10::Dispatcher::singleton();
    for (const auto& name : pending_) {
      if (kernels_.count(name) != 0) {
        continue;
      }
      auto op = dispatcher.findSchema(name);
      if (!op.has_value()) {
        continue;
      }
      // Ops with LibTorch's own ADInplaceOrView kernel stay out of reach.
      if (op->hasKernelForDispatchKey(kPerOpKey)) {
        continue;
      }
      for (const auto& filter : filters_) {
        if (filter(*op)) {
          register_kernel_locked(*op);
          break;
        }
      }
    }
    pending_.clear();
  }

  void register_kernel_locked(const c10::OperatorHandle& op) {
    const auto& name = op.operator_name();
    if (kernels_.count(name) != 0) {
      return;
    }
    TORCH_CHECK(!op.hasKernelForDispatchKey(kPerOpKey), "sac: cannot intercept ", name,
                ": LibTorch registers its own ADInplaceOrView kernel for "
                "it (it is a view, in-place or out= op), and sac never replaces "
                "a LibTorch kernel. Such ops are always recomputed.");
    kernels_.emplace(
        name, c10::Dispatcher::singleton().registerImpl(
                  name, kPerOpKey,
                  c10::KernelFunction::makeFromBoxedFunction<&intercepting_kernel<kPerOpKey>>(),
                  std::nullopt, nullptr,
                  "sac: selective activation checkpointing (per-op kernel below "
                  "autograd)"));
  }

  std::mutex mutex_;
  std::optional<Mechanism> mechanism_;
  bool in_use_ = false;
  std::atomic<bool> activated_{false};
  std::optional<c10::RegistrationHandleRAII> fallback_;
  std::unordered_map<c10::OperatorName, c10::RegistrationHandleRAII> kernels_;
  std::vector<OpFilter> filters_;
  std::once_flag listener_once_;
  c10::RegistrationHandleRAII* listener_ = nullptr;  // leaked with the registry
  std::vector<c10::OperatorName> pending_;

  std::mutex pending_mutex_;
  std::vector<c10::OperatorName> incoming_;
  std::atomic<bool> has_pending_{false};
};

}  // namespace

std::string_view to_string(Mechanism mechanism) {
  switch (mechanism) {
    case Mechanism::PerOpKernels: return "per-op kernels on ADInplaceOrView";
    case Mechanism::FallbackKey: return "fallback on the Fake key";
  }
  return "unknown";
}

c10::DispatchKey interception_key(Mechanism mechanism) {
  return mechanism == Mechanism::FallbackKey ? kFallbackKey : kPerOpKey;
}

void set_mechanism(std::optional<Mechanism> mechanism) { Registry::get().set(mechanism); }

Mechanism mechanism() { return Registry::get().resolve(); }

bool fallback_key_available(std::string* reason) {
  auto& dispatcher = c10::Dispatcher::singleton();
  // Our own fallback, once registered, does not make the key unavailable.
  if (our_fallback_registered.load()) {
    return true;
  }
  if (dispatcher.hasBackendFallbackForDispatchKey(kFallbackKey)) {
    if (reason != nullptr) {
      *reason = "LibTorch (or another library) already registers a fallback "
                "on DispatchKey::Fake";
    }
    return false;
  }
  const auto ops = dispatcher.getAllOpNamesForDispatchKey(kFallbackKey);
  if (!ops.empty()) {
    if (reason != nullptr) {
      *reason = "operators such as " + c10::toString(ops.front()) +
                " have kernels on DispatchKey::Fake, which a fallback there "
                "would not see";
    }
    return false;
  }
  return true;
}

bool per_op_kernels_miss(const c10::OperatorHandle& op) {
  // The aten ops behind torch::'s factory functions (LibTorch 2.13's
  // torch/csrc/autograd/generated/variable_factories.h), whose overloads
  // with TensorOptions (a `dtype` argument) those functions call. Not
  // aten::_to_copy: its ordinary caller, Tensor::to, is seen.
  static const std::unordered_set<std::string> factories{
      "aten::arange",
      "aten::bartlett_window",
      "aten::blackman_window",
      "aten::empty",
      "aten::empty_like",
      "aten::empty_permuted",
      "aten::empty_quantized",
      "aten::empty_strided",
      "aten::eye",
      "aten::fft_fftfreq",
      "aten::fft_rfftfreq",
      "aten::from_file",
      "aten::full",
      "aten::full_like",
      "aten::hamming_window",
      "aten::hann_window",
      "aten::kaiser_window",
      "aten::linspace",
      "aten::logspace",
      "aten::normal",
      "aten::ones",
      "aten::ones_like",
      "aten::rand",
      "aten::rand_like",
      "aten::randint",
      "aten::randint_like",
      "aten::randn",
      "aten::randn_like",
      "aten::randperm",
      "aten::range",
      "aten::scalar_tensor",
      "aten::sparse_bsc_tensor",
      "aten::sparse_bsr_tensor",
      "aten::sparse_compressed_tensor",
      "aten::sparse_coo_tensor",
      "aten::sparse_csc_tensor",
      "aten::sparse_csr_tensor",
      "aten::tril_indices",
      "aten::triu_indices",
      "aten::zeros",
      "aten::zeros_like",
      "aten::_cudnn_init_dropout_state",
      "aten::_efficientzerotensor",
      "aten::_empty_affine_quantized",
      "aten::_empty_per_channel_affine_quantized"};
  if (factories.count(op.operator_name().name) == 0) {
    return false;
  }
  for (const auto& argument : op.schema().arguments()) {
    if (argument.name() == "dtype") {
      return true;
    }
  }
  return false;
}

bool mechanism_misses(const c10::OperatorHandle& op) {
  // Asked for every call a callback keeps: under the fallback key, once
  // active, one load.
  const std::optional<Mechanism> active = Registry::get().activated();
  if (active == Mechanism::FallbackKey) {
    return false;
  }
  return per_op_kernels_miss(op) &&
         (active.has_value() ? *active : mechanism()) == Mechanism::PerOpKernels;
}

void intercept_ops(c10::ArrayRef<c10::OperatorHandle> ops) { Registry::get().intercept(ops); }

void intercept_ops_matching(OpFilter filter) { Registry::get().intercept_matching(filter); }

InterceptorToken push_interceptor(OpInterceptor* interceptor) {
  Registry::get().activate();
  InterceptorToken token{std::exchange(tls_state.interceptor, interceptor)};
  sync_fallback_key(tls_state);
  return token;
}

void pop_interceptor(const InterceptorToken& token) {
  tls_state.interceptor = token.previous;
  sync_fallback_key(tls_state);
}

void add_observer(OpObserver* observer) {
  TORCH_INTERNAL_ASSERT(observer != nullptr);
  Registry::get().activate();
  tls_observers.push_back(observer);
  tls_state.observing = true;
  sync_fallback_key(tls_state);
}

void remove_observer(OpObserver* observer) {
  auto it = std::find(tls_observers.rbegin(), tls_observers.rend(), observer);
  TORCH_INTERNAL_ASSERT(it != tls_observers.rend(),
                        "sac: removing an op observer that is not active on this thread");
  tls_observers.erase(std::next(it).base());
  tls_state.observing = !tls_observers.empty();
  sync_fallback_key(tls_state);
}

bool is_observing(const OpObserver* observer) {
  return std::find(tls_observers.begin(), tls_observers.end(), observer) != tls_observers.end();
}

OpInterceptor* active_interceptor() {
  if (tls_state.interceptor != nullptr) {
    return tls_state.interceptor;
  }
  const Carried* carried = carried_to(tls_state);
  return carried == nullptr ? nullptr : carried->interceptor;
}

struct CarryToEngineThreads::Carry {
  Carry()
      : hidden(tls_state),
        hidden_observers(std::exchange(tls_observers, {})),
        carry(kCarriedSlot, hidden.interceptor,
              hidden.observing ? hidden_observers : std::vector<OpObserver*>{}) {
    // This thread takes turns with the others too.
    tls_state = ThreadState{};
    sync_fallback_key(tls_state);
  }
  ~Carry() {
    tls_state = hidden;
    tls_observers = std::move(hidden_observers);
  }
  const ThreadState hidden;
  std::vector<OpObserver*> hidden_observers;
  detail::CarriedGuard<Carried> carry;
};

CarryToEngineThreads::CarryToEngineThreads() {
  const bool own = tls_state.interceptor != nullptr || tls_state.observing;
  if (own || (tls_state.shielded && detail::carried<Carried>(kCarriedSlot) != nullptr)) {
    carry_ = std::make_unique<Carry>();
  }
}

CarryToEngineThreads::~CarryToEngineThreads() {
  carry_.reset();
  sync_fallback_key(tls_state);
}

bool observers_see_every_op(std::string* reason) {
  if (mechanism() == Mechanism::FallbackKey) {
    return true;
  }
  if (reason != nullptr) {
    std::string why;
    *reason = fallback_key_available(&why)
                  ? "this process uses per-op kernels (SAC_DISPATCH=per_op or "
                    "sac::dispatch::set_mechanism), which never see views, "
                    "in-place or out= ops"
                  : "the fallback key is taken (" + why +
                        "), so sac uses per-op kernels, which never see views, "
                        "in-place or out= ops";
  }
  return false;
}

void call_op(const c10::OperatorHandle& op, c10::DispatchKeySet below, bool intercepted,
             torch::jit::Stack* stack) {
  if (intercepted) {
    TORCH_INTERNAL_ASSERT(our_fallback_registered.load(std::memory_order_relaxed),
                          "sac: call_op(intercepted) needs the fallback key");
    // Through the fallback, whose kernel takes `below` back from the set.
    op.redispatchBoxed(below | c10::DispatchKeySet(kFallbackKey), stack);
    return;
  }
  // As the ops an interceptor runs: hidden from everything on the thread.
  SuspendInterception suspend(tls_state, c10::impl::tls_is_dispatch_key_included(kFallbackKey));
  op.redispatchBoxed(below, stack);
}

IsolationGuard::IsolationGuard()
    : hidden_interceptor_(std::exchange(tls_state.interceptor, nullptr)),
      hidden_observing_(std::exchange(tls_state.observing, false)),
      hidden_shielded_(std::exchange(tls_state.shielded, true)),
      hidden_fallback_included_(c10::impl::tls_is_dispatch_key_included(kFallbackKey)),
      hidden_observers_(std::exchange(tls_observers, {})) {
  sync_fallback_key(tls_state);
}

IsolationGuard::~IsolationGuard() {
  TORCH_INTERNAL_ASSERT(tls_state.interceptor == nullptr && tls_observers.empty(),
                        "sac: an interceptor or observer outlived the isolation "
                        "guard it was added under");
  tls_state.interceptor = hidden_interceptor_;
  tls_state.observing = hidden_observing_;
  tls_state.shielded = hidden_shielded_;
  tls_observers = std::move(hidden_observers_);
  if (c10::impl::tls_is_dispatch_key_included(kFallbackKey) != hidden_fallback_included_) {
    c10::impl::tls_set_dispatch_key_included(kFallbackKey, hidden_fallback_included_);
  }
}

}  // namespace sac::dispatch
