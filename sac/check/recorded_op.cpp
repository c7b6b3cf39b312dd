#include <sac/check/internal/recorded_op.h>

#include <sac/dispatch/internal/op_facts.h>

#include <memory>
#include <mutex>
#include <unordered_map>

namespace sac::detail {

const RecordedOp* recorded_op(const at::RecordFunction& fn) {
  thread_local std::unordered_map<const char*, const RecordedOp*> by_pointer;
  const char* name = fn.name();
  const auto it = by_pointer.find(name);
  if (it != by_pointer.end() && it->second->name == name) {
    return it->second;
  }
  // By name and overload: a RecordFunction names an op without its
  // overload (aten::mul for mul.Tensor and mul.out alike), and the two
  // differ in what they write.
  const std::optional<c10::OperatorName> op_name = fn.operator_name();
  std::string key = name;
  if (op_name.has_value()) {
    key += '.';
    key += op_name->overload_name;
  }
  static std::mutex mutex;
  static std::unordered_map<std::string, std::unique_ptr<RecordedOp>> by_name;
  const std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<RecordedOp>& op = by_name[key];
  if (!op) {
    op = std::make_unique<RecordedOp>();
    op->name = name;
    if (op_name.has_value()) {
      op->handle = c10::Dispatcher::singleton().findOp(*op_name);
    }
    if (op->handle.has_value() && op->handle->hasSchema()) {
      // set_ points a tensor at a storage: like a view, it makes no values.
      op->view = detail::is_view(*op->handle) || op->handle->operator_name().name == "aten::set_";
      op->uninitialized = detail::makes_uninitialized_memory(*op->handle);
      op->random = detail::is_random(*op->handle);
      op->writes_argument = detail::declares_a_write(*op->handle);
      const auto& arguments = op->handle->schema().arguments();
      for (size_t i = 0; i < arguments.size(); ++i) {
        const c10::Argument& argument = arguments[i];
        if (argument.name() == "running_mean" || argument.name() == "running_var") {
          op->state_arguments.push_back(i);
        }
      }
    }
  }
  by_pointer[name] = op.get();
  return op.get();
}

}  // namespace sac::detail
