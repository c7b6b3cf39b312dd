// Under per-op kernels, the ops no kernel intercepts that write an argument
// (h.add_(buf), torch::add_out), shown to an observer after all.
//
// The outside-tensor check notes what a region reads (outside_tensor_watch.h)
// through an op observer, and under per-op kernels an observer sees only the
// intercepted ops: never in-place or out= ops, which keep LibTorch's own
// ADInplaceOrView kernels. A buffer read by `h.add_(buf)` and modified before
// backward would then recompute silently wrong. While a scope is alive, a
// thread-local RecordFunction callback calls the observer's before_op for
// such ops (ObservedOp with no interceptor and no key set): every op of the
// thread pays the callback (measured in BENCHMARKS.md), so it is installed
// only under per-op kernels, only where the check is on, for the region's
// forward and recomputation. Under the fallback key it does nothing: the
// observer sees those ops already.
//
// RecordFunction swallows what its callbacks throw (it logs a warning), so
// an error the observer raises there is kept and thrown at the thread's next
// intercepted op, or by rethrow_pending() where the caller ends the pass.
#pragma once

#include <sac/dispatch/internal/interceptor.h>

#include <exception>
#include <optional>

namespace sac::detail {

class InPlaceReadsScope {
 public:
  // `observer` is also added to the thread (detail::ObserverGuard) by the
  // caller, which keeps it alive; an isolation hides it here too.
  explicit InPlaceReadsScope(detail::OpObserver* observer);
  ~InPlaceReadsScope();
  InPlaceReadsScope(const InPlaceReadsScope&) = delete;
  InPlaceReadsScope& operator=(const InPlaceReadsScope&) = delete;

  // Throws what the observer raised at an in-place op, if it did (once).
  void rethrow_pending();

  // From the callback: the observer sees `call`, unless an isolation hides
  // it; what it throws is kept.
  void observe(const detail::ObservedOp& call, c10::ArrayRef<c10::IValue> args);

 private:
  // Throws the pending error at the next op an observer sees.
  class Rethrow final : public detail::OpObserver {
   public:
    explicit Rethrow(InPlaceReadsScope& scope) : scope_(scope) {}
    void before_op(const detail::ObservedOp&, c10::ArrayRef<c10::IValue>) override {
      scope_.rethrow_pending();
    }
    void after_op(const detail::ObservedOp&, c10::ArrayRef<c10::IValue>) override {}

   private:
    InPlaceReadsScope& scope_;
  };

  detail::OpObserver* observer_;
  std::exception_ptr pending_;
  Rethrow rethrow_{*this};
  std::optional<detail::ObserverGuard> rethrow_guard_;
  bool active_ = false;
};

}  // namespace sac::detail
