#include <sac/base/internal/early_stop.h>

#include <sac/base/internal/check.h>

namespace sac::detail {
namespace {

thread_local RecomputationScope* tls_innermost = nullptr;

}  // namespace

RecomputationScope::RecomputationScope() : outer_(tls_innermost) { tls_innermost = this; }

RecomputationScope::~RecomputationScope() { tls_innermost = outer_; }

void stop_recomputation() {
  if (tls_innermost != nullptr) {
    tls_innermost->stopped_ = true;
  }
  throw StopRecomputation{};
}

void note_recomputation_error(const CheckpointError& error) {
  if (tls_innermost != nullptr && !tls_innermost->stopped_ && !tls_innermost->failed_) {
    tls_innermost->failed_.emplace(error);
  }
}

void throw_if_recomputation_stopped() {
  if (tls_innermost == nullptr) {
    return;
  }
  if (tls_innermost->failed_) {
    throw_checkpoint_error(*tls_innermost->failed_);
  }
  if (tls_innermost->stopped_) {
    throw StopRecomputation{};
  }
}

}  // namespace sac::detail
