#include <sac/base/internal/stash.h>

#include <sac/dispatch/internal/carried.h>

#include <utility>

namespace sac::detail {
namespace {
thread_local TensorStash* tls_stash = nullptr;

constexpr std::string_view kCarriedName = "sac::detail::TensorStash";
const c10::DebugInfoKind kCarriedKind(&kCarriedName);
}  // namespace

TensorStash* current_stash() {
  if (tls_stash != nullptr) {
    return tls_stash;
  }
  TensorStash** carried = detail::carried<TensorStash*>(kCarriedKind);
  return carried == nullptr ? nullptr : *carried;
}

struct CarryStash::Carry {
  explicit Carry(TensorStash* stash) : carry(kCarriedKind, stash) {}
  detail::CarriedGuard<TensorStash*> carry;
};

CarryStash::CarryStash() {
  if (tls_stash != nullptr) {
    carry_ = std::make_unique<Carry>(tls_stash);
  }
}

CarryStash::~CarryStash() = default;

StashScope::StashScope(std::shared_ptr<TensorStash> stash)
    : stash_(std::move(stash)), outer_(std::exchange(tls_stash, stash_.get())) {}

StashScope::~StashScope() { tls_stash = outer_; }

}  // namespace sac::detail
