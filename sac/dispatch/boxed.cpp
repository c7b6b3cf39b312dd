#include <sac/dispatch/internal/boxed.h>

#include <algorithm>
#include <string>
#include <unordered_set>
#include <vector>

namespace sac::detail {
namespace {

// Ops whose arguments 3 and 4 (running_mean, running_var) are written when
// argument 5 (training) is true, though their schema does not say so.
const std::vector<c10::OperatorHandle>& legacy_batch_norms() {
  static const std::vector<c10::OperatorHandle> ops = registered_ops({
      {"aten::native_batch_norm", ""},
      {"aten::native_batch_norm", "out"},
      {"aten::cudnn_batch_norm", ""},
      {"aten::cudnn_batch_norm", "out"},
      {"aten::miopen_batch_norm", ""},
      {"aten::miopen_batch_norm", "out"},
  });
  return ops;
}

}  // namespace

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

bool writes_argument(const c10::OperatorHandle& op, size_t index, c10::ArrayRef<c10::IValue> args) {
  const auto* alias = op.schema().arguments()[index].alias_info();
  if (alias != nullptr) {
    return alias->isWrite();
  }
  if (index != 3 && index != 4) {
    return false;
  }
  const auto& legacy = legacy_batch_norms();
  return std::find(legacy.begin(), legacy.end(), op) != legacy.end() && args.size() > 5 &&
         args[5].isBool() && args[5].toBool();
}

bool overwrites_argument(const c10::OperatorHandle& op, size_t index) {
  const c10::Argument& argument = op.schema().arguments()[index];
  if (argument.is_out()) {
    return true;
  }
  static const std::unordered_set<std::string> names{
      "aten::copy_",      "aten::fill_",   "aten::zero_",      "aten::normal_",
      "aten::uniform_",   "aten::random_", "aten::bernoulli_", "aten::exponential_",
      "aten::geometric_", "aten::cauchy_", "aten::log_normal_"};
  return index == 0 && argument.alias_info() != nullptr && argument.alias_info()->isWrite() &&
         names.count(op.operator_name().name) != 0;
}

bool spans_storage(const at::Tensor& t) {
  return t.has_storage() && t.storage_offset() == 0 && t.is_contiguous() &&
         t.nbytes() == t.storage().nbytes();
}

}  // namespace sac::detail
