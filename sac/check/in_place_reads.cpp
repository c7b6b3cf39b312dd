#include <sac/check/internal/in_place_reads.h>

#include <sac/check/internal/callback_stack.h>
#include <sac/check/internal/recorded_op.h>

#include <ATen/record_function.h>

#include <utility>

namespace sac::detail {
namespace {

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn);

thread_local CallbackStack<InPlaceReadsScope*> tls_scopes(
    at::RecordFunctionCallback(&on_start).needsInputs(true).scopes({at::RecordScope::FUNCTION}));

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  const RecordedOp* op = recorded_op(fn);
  if (!op->writes_argument) {
    return nullptr;
  }
  const detail::ObservedOp call{*op->handle, c10::DispatchKeySet(), nullptr};
  const c10::ArrayRef<c10::IValue> args(fn.inputs().data(), fn.inputs().size());
  for (InPlaceReadsScope* scope : tls_scopes.items()) {
    scope->observe(call, args);
  }
  return nullptr;
}

}  // namespace

InPlaceReadsScope::InPlaceReadsScope(detail::OpObserver* observer) : observer_(observer) {
  if (!detail::observers_see_every_op()) {
    rethrow_guard_.emplace(&rethrow_);
    tls_scopes.push(this);
    active_ = true;
  }
}

InPlaceReadsScope::~InPlaceReadsScope() {
  if (active_) {
    tls_scopes.pop();
  }
}

void InPlaceReadsScope::observe(const detail::ObservedOp& call, c10::ArrayRef<c10::IValue> args) {
  if (pending_ || !detail::is_observing(observer_)) {
    return;
  }
  try {
    observer_->before_op(call, args);
  } catch (...) {
    pending_ = std::current_exception();
  }
}

void InPlaceReadsScope::rethrow_pending() {
  if (pending_) {
    std::rethrow_exception(std::exchange(pending_, nullptr));
  }
}

}  // namespace sac::detail
