#include <sac/dispatch/internal/boxed.h>

#include <algorithm>
#include <string>
#include <unordered_set>
#include <vector>

namespace sac::detail {
namespace {}  // namespace

std::vector<c10::OperatorHandle> registered_ops(
    c10::ArrayRef<std::pair<const char*, const char*>> names) {
  std::vector<c10::OperatorHandle> found;
  for (const auto& [name, overload] : names) {
    if (auto op = c10::Dispatcher::singleton().findSchema({name, overload})) {
      found.push_back(*op);
    }
  }
  return found;
}

bool spans_storage(const at::Tensor& t) {
  return t.has_storage() && t.storage_offset() == 0 && t.is_contiguous() &&
         t.nbytes() == t.storage().nbytes();
}

}  // namespace sac::detail
