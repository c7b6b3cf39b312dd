// Reading an op's boxed arguments and outputs, for the code that handles
// intercepted ops.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <utility>
#include <vector>

namespace sac::detail {

// The arguments of `op` on `stack`, before it runs.
inline c10::ArrayRef<c10::IValue> arguments_on(const c10::OperatorHandle& op,
                                               const torch::jit::Stack& stack) {
  return torch::jit::last(stack, op.schema().arguments().size());
}

// The outputs of `op` on `stack`, after it ran.
inline c10::ArrayRef<c10::IValue> outputs_on(const c10::OperatorHandle& op,
                                             const torch::jit::Stack& stack) {
  return torch::jit::last(stack, op.schema().returns().size());
}

// An op's identity as an address (its dispatcher entry, which lives as long
// as the op is registered): the key of sac's per-op tables. The dispatcher
// hashes an op by that address.
inline const void* op_key(const c10::OperatorHandle& op) {
  return reinterpret_cast<const void*>(std::hash<c10::OperatorHandle>{}(op));
}

// The registered ops among `names` ({name, overload}; "" for the default
// overload), in order. Names not registered in this process are left out.
std::vector<c10::OperatorHandle> registered_ops(
    c10::ArrayRef<std::pair<const char*, const char*>> names);

// Whether `t` covers all of its storage, densely: writing all of `t` writes
// every byte of the storage.
bool spans_storage(const at::Tensor& t);

// Calls `f` on each defined tensor in `value` (a tensor, an optional
// tensor, or a list of them, nested), in order.
template <class F>
void for_each_tensor(const c10::IValue& value, F&& f) {
  if (value.isTensor()) {
    if (value.toTensor().defined()) {
      f(value.toTensor());
    }
  } else if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorList()) {
      if (t.defined()) {
        f(t);
      }
    }
  } else if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) {
      for_each_tensor(element, f);
    }
  }
}

}  // namespace sac::detail
