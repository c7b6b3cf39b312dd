#include <sac/dispatch/internal/interceptor.h>

#include <sac/dispatch/internal/boxed.h>
#include <sac/dispatch/internal/carried.h>
#include <sac/dispatch/internal/registry.h>

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

namespace sac::detail {
namespace {

// The thread's interception state. `observing` caches "observers is not
// empty and not suspended", so the hot path reads one struct. `shielded`:
// interception is suspended or isolated here, so what a backward pass
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
constexpr std::string_view kCarriedName = "sac::detail::Carried";
const c10::DebugInfoKind kCarriedKind(&kCarriedName);

// An empty snapshot masks the ones below it: a backward called where
// interception is isolated carries nothing.
Carried* carried_to(const ThreadState& state) {
  if (state.shielded) {
    return nullptr;
  }
  Carried* carried = detail::carried<Carried>(kCarriedKind);
  return carried == nullptr || (carried->interceptor == nullptr && carried->observers.empty())
             ? nullptr
             : carried;
}

// The fallback key is in the thread's included key set exactly while
// something on the thread wants to see ops and the fallback mechanism is in
// use. Called when that may change, never per op.
void sync_fallback_key(const ThreadState& state) {
  const bool wanted =
      own_fallback_registered() &&
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

// An op on a thread with nothing of its own active: what a backward pass
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

}  // namespace

// The one boxed kernel, placed at `Key` by either mechanism (registry.cpp).
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
template void intercepting_kernel<kFallbackKey>(const c10::OperatorHandle&, c10::DispatchKeySet,
                                                torch::jit::Stack*);
template void intercepting_kernel<kPerOpKey>(const c10::OperatorHandle&, c10::DispatchKeySet,
                                             torch::jit::Stack*);

InterceptorToken push_interceptor(OpInterceptor* interceptor) {
  activate_interception();
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
  activate_interception();
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
        carry(kCarriedKind, hidden.interceptor,
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
  if (own || (tls_state.shielded && detail::carried<Carried>(kCarriedKind) != nullptr)) {
    carry_ = std::make_unique<Carry>();
  }
}

CarryToEngineThreads::~CarryToEngineThreads() {
  carry_.reset();
  sync_fallback_key(tls_state);
}

bool observers_see_every_op(std::string* reason) {
  if (dispatch::mechanism() == dispatch::Mechanism::FallbackKey) {
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
    TORCH_INTERNAL_ASSERT(own_fallback_registered(),
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

}  // namespace sac::detail
