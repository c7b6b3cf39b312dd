// Note [The interceptor]
//
// Interception of aten ops below autograd.
//
// sac's modes must see each op *below* the Autograd and ADInplaceOrView keys:
// when a recomputed op is served from the cache, autograd above it still runs
// and saves the same tensors, in the same order, as in the forward. This file
// is the only place that knows how sac hooks into the c10 dispatcher. It knows
// nothing of policies or caches: an `OpInterceptor` receives an op with its
// boxed arguments and leaves the op's outputs on the stack.
//
// Two mechanisms place that kernel (sac/dispatch/mechanism.h).
//
// While an interceptor or observer runs, interception is suspended on its
// thread: ops it (or the real kernel it redispatches to) calls are not
// intercepted again. With nothing active on a thread, an intercepting kernel
// costs one thread-local load and a redispatch.
#pragma once

#include <sac/dispatch/mechanism.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DispatchKeySet.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sac::detail {

// Receives the ops intercepted on a thread while it is active.
class OpInterceptor {
 public:
  virtual ~OpInterceptor() = default;

  // `stack` holds the op's arguments; on return it must hold its outputs.
  // `below` is the key set that computes the op the ordinary way: pass it to
  // `run_op`.
  virtual void intercept(const c10::OperatorHandle& op, c10::DispatchKeySet below,
                         torch::jit::Stack* stack) = 0;
};

// Runs `op` on `stack` with the kernels below the interception point.
inline void run_op(const c10::OperatorHandle& op, c10::DispatchKeySet below,
                   torch::jit::Stack* stack) {
  op.redispatchBoxed(below, stack);
}

// With `PerOpKernels`, registers intercepting kernels for `ops` (once per op,
// kept for the life of the process). With `FallbackKey`, does nothing: every
// op is seen. Throws, naming the op, if an op cannot be intercepted (core has
// its own ADInplaceOrView kernel for it).
void intercept_ops(c10::ArrayRef<c10::OperatorHandle> ops);

// Like `intercept_ops` for every registered op that satisfies `filter`, and
// for every op registered later that does (they are picked up when an
// interceptor is next activated). Ops with LibTorch's own ADInplaceOrView
// kernel are skipped. `filter` must be callable from any thread. Installing
// a filter that is already installed costs a lock and a lookup.
using OpFilter = bool (*)(const c10::OperatorHandle& op);
void intercept_ops_matching(OpFilter filter);

// What an observer is told about an op, besides its arguments or outputs.
struct ObservedOp {
  const c10::OperatorHandle& op;
  // The keys it runs with below the interception point: with `call_op`, the
  // op can be run again as it ran here.
  c10::DispatchKeySet below;
  // The interceptor that handles it, or null when it just runs.
  const OpInterceptor* interceptor;
};

// Sees every op intercepted on its thread while it is added, whichever
// interceptor (if any) handles it: all observers of a thread see each op, in
// the order they were added. Observers only look; they must not change the
// stack. Ops they run themselves are not intercepted.
//
// Under `PerOpKernels`, an observer sees only the ops that have an
// intercepting kernel (see intercept_ops_matching): never views, in-place or
// out= ops, which keep LibTorch's own ADInplaceOrView kernel. See
// observers_see_every_op.
class OpObserver {
 public:
  virtual ~OpObserver() = default;
  // Before the op runs (or is served by the interceptor): its arguments.
  virtual void before_op(const ObservedOp& call, c10::ArrayRef<c10::IValue> args) = 0;
  // After it returned normally: its outputs.
  virtual void after_op(const ObservedOp& call, c10::ArrayRef<c10::IValue> outputs) = 0;
};

// Whether observers see every op dispatched on their thread, views, in-place
// and out= ops included: true under `FallbackKey` only. Chooses the mechanism
// if none is chosen yet. When false, `reason` (if given) says why.
bool observers_see_every_op(std::string* reason = nullptr);

// Runs an op that an observer saw, again, on `stack` (its arguments): with
// the key set `below` it ran with, and, if `intercepted`, through the
// interceptor and observers active on this thread now, as if it were called
// from where sac intercepts. Without `intercepted`, nothing sees it, nor the
// ops its kernel calls. `intercepted` needs `observers_see_every_op()`.
void call_op(const c10::OperatorHandle& op, c10::DispatchKeySet below, bool intercepted,
             torch::jit::Stack* stack);

// Adds `observer` on this thread / removes it. Prefer `ObserverGuard`.
void add_observer(OpObserver* observer);
void remove_observer(OpObserver* observer);
// Whether `observer` sees this thread's ops now (an isolation hides it).
bool is_observing(const OpObserver* observer);

class ObserverGuard {
 public:
  explicit ObserverGuard(OpObserver* observer) : observer_(observer) { add_observer(observer_); }
  ~ObserverGuard() { remove_observer(observer_); }
  ObserverGuard(const ObserverGuard&) = delete;
  ObserverGuard& operator=(const ObserverGuard&) = delete;

 private:
  OpObserver* observer_;
};

// While alive, nothing intercepts or observes ops on this thread: the
// interceptor and observers active before are hidden until it dies, and new
// ones can be added on top (and must be gone by then). Code whose ops belong
// to no enclosing interceptor runs under one: a checkpoint's recomputation is
// then seen by its own contexts only, whether it runs in the ordinary
// backward or inside an enclosing region's forward.
class IsolationGuard {
 public:
  IsolationGuard();
  ~IsolationGuard();
  IsolationGuard(const IsolationGuard&) = delete;
  IsolationGuard& operator=(const IsolationGuard&) = delete;

 private:
  // The thread's state before, restored as it was: inside an interceptor or
  // observer, interception is suspended, and must stay so after the guard.
  OpInterceptor* hidden_interceptor_;
  bool hidden_observing_;
  bool hidden_shielded_;
  bool hidden_fallback_included_;
  std::vector<OpObserver*> hidden_observers_;
};

// What `push_interceptor` replaced; give it back to `pop_interceptor`.
struct InterceptorToken {
  OpInterceptor* previous = nullptr;
};

// Makes `interceptor` the active one on this thread (it replaces, and hides,
// the previous one until popped). Prefer `InterceptorGuard`; this pair exists
// for contexts whose entry and exit are separate functions.
InterceptorToken push_interceptor(OpInterceptor* interceptor);
void pop_interceptor(const InterceptorToken& token);

// The interceptor active on this thread (or carried to it, below), or
// nullptr.
OpInterceptor* active_interceptor();

// While alive, the interceptor and observers active on this thread act on
// every thread that runs under an at::ThreadLocalState captured meanwhile:
// the autograd engine's device threads, for a backward called inside a
// checkpointed forward, see what the calling thread sees. Those threads, and
// this one, take turns through them, one op at a time. sac's autograd engine
// holds one around each backward pass (sac/base/internal/saved_tensor_hooks.h).
class CarryToEngineThreads {
 public:
  CarryToEngineThreads();
  ~CarryToEngineThreads();
  CarryToEngineThreads(const CarryToEngineThreads&) = delete;
  CarryToEngineThreads& operator=(const CarryToEngineThreads&) = delete;

 private:
  struct Carry;
  std::unique_ptr<Carry> carry_;
};

// RAII form of push_interceptor / pop_interceptor.
class InterceptorGuard {
 public:
  explicit InterceptorGuard(OpInterceptor* interceptor) : token_(push_interceptor(interceptor)) {}
  ~InterceptorGuard() { pop_interceptor(token_); }
  InterceptorGuard(const InterceptorGuard&) = delete;
  InterceptorGuard& operator=(const InterceptorGuard&) = delete;

 private:
  InterceptorToken token_;
};

}  // namespace sac::detail
