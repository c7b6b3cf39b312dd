#include <sac/checkpoint/scope.h>

#include <c10/util/Exception.h>

#include <vector>

namespace sac {
namespace {
thread_local std::vector<CheckpointOptions> tls_scopes;
}  // namespace

CheckpointScope::CheckpointScope(CheckpointOptions options) {
  tls_scopes.push_back(std::move(options));
}

CheckpointScope::~CheckpointScope() {
  TORCH_INTERNAL_ASSERT(!tls_scopes.empty(), "sac: a CheckpointScope ended twice");
  tls_scopes.pop_back();
}

namespace detail {
CheckpointOptions scoped_options() {
  return tls_scopes.empty() ? CheckpointOptions() : tls_scopes.back();
}
}  // namespace detail

}  // namespace sac
