#include <sac/checkpoint/guards.h>

namespace sac {
namespace {
thread_local std::optional<bool> tls_early_stop;
thread_local std::optional<bool> tls_debug;
thread_local std::optional<DeterminismCheck> tls_determinism_check;
}  // namespace

EarlyStopGuard::EarlyStopGuard(bool enabled) : previous_(tls_early_stop) {
  tls_early_stop = enabled;
}
EarlyStopGuard::~EarlyStopGuard() { tls_early_stop = previous_; }

DebugGuard::DebugGuard(bool enabled) : previous_(tls_debug) { tls_debug = enabled; }
DebugGuard::~DebugGuard() { tls_debug = previous_; }

DeterminismCheckGuard::DeterminismCheckGuard(DeterminismCheck check)
    : previous_(tls_determinism_check) {
  tls_determinism_check = check;
}
DeterminismCheckGuard::~DeterminismCheckGuard() { tls_determinism_check = previous_; }

namespace detail {
std::optional<bool> early_stop_override() { return tls_early_stop; }
std::optional<bool> debug_override() { return tls_debug; }
std::optional<DeterminismCheck> determinism_check_override() { return tls_determinism_check; }
}  // namespace detail

}  // namespace sac
