#include <sac/region/stash.h>

#include <utility>

namespace sac {
namespace {
thread_local TensorStash* tls_stash = nullptr;
}  // namespace

TensorStash* current_stash() { return tls_stash; }

StashScope::StashScope(std::shared_ptr<TensorStash> stash)
    : stash_(std::move(stash)), outer_(std::exchange(tls_stash, stash_.get())) {}

StashScope::~StashScope() { tls_stash = outer_; }

}  // namespace sac
