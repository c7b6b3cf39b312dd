#include <sac/base/internal/region_events.h>

#include <utility>

namespace sac::detail {
namespace {

thread_local RegionEvents* tls_listener = nullptr;

}  // namespace

RegionEvents* region_events() { return tls_listener; }

bool regions_run_plainly() {
  return tls_listener != nullptr && tls_listener->regions_run_plainly();
}

RegionEventsGuard::RegionEventsGuard(RegionEvents* listener)
    : previous_(std::exchange(tls_listener, listener)) {}

RegionEventsGuard::~RegionEventsGuard() { tls_listener = previous_; }

}  // namespace sac::detail
