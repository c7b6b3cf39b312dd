#include "python_policy.h"

#include <sac/policy/internal/answers.h>

#include <torch/csrc/jit/python/pybind_utils.h>

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace sac::python {
namespace {

// Python objects that live as long as the interpreter: leaked on purpose,
// since destroying them after Python's finalization would crash.
py::object& checkpoint_module() {
  static auto* module = new py::object(py::module_::import("torch.utils.checkpoint"));
  return *module;
}

// The op as Python sees it: torch.ops.<namespace>.<name>.<overload>.
py::object op_object(const c10::OperatorHandle& op) {
  static auto* objects = new std::unordered_map<c10::OperatorName, py::object>();
  auto found = objects->find(op.operator_name());
  if (found != objects->end()) {
    return found->second;
  }
  const auto& name = op.operator_name();
  auto separator = name.name.find("::");
  TORCH_CHECK(separator != std::string::npos, "sac: op name without a namespace: ", name.name);
  py::object object =
      py::module_::import("torch")
          .attr("ops")
          .attr(name.name.substr(0, separator).c_str())
          .attr(name.name.substr(separator + 2).c_str())
          .attr(name.overload_name.empty() ? "default" : name.overload_name.c_str());
  objects->emplace(name, object);
  return object;
}

// A Python object owned from C++: the last copy of a policy may be dropped on
// a thread without the GIL (autograd's, freeing a graph).
std::shared_ptr<py::object> owned(py::object object) {
  return std::shared_ptr<py::object>(new py::object(std::move(object)), [](py::object* o) {
    if (Py_IsInitialized() == 0) {
      return;  // The interpreter is gone: nothing can be released any more.
    }
    py::gil_scoped_acquire gil;
    delete o;
  });
}

py::object outputs(c10::ArrayRef<c10::IValue> output) {
  if (output.size() == 1) {
    return torch::jit::toPyObject(output[0]);
  }
  py::tuple tuple(output.size());
  for (size_t i = 0; i < output.size(); ++i) {
    tuple[i] = torch::jit::toPyObject(output[i]);
  }
  return tuple;
}

// An op's outputs as they lie on the dispatcher's stack, typed by its schema.
std::vector<c10::IValue> output_stack(const c10::FunctionSchema& schema, py::handle output) {
  const auto& returns = schema.returns();
  std::vector<c10::IValue> stack;
  if (returns.empty()) {
    return stack;
  }
  if (returns.size() == 1) {
    stack.push_back(torch::jit::toIValue(output, returns[0].type()));
    return stack;
  }
  py::tuple items = py::reinterpret_borrow<py::tuple>(output);
  TORCH_CHECK(items.size() == returns.size(), "sac: ", schema.name(), " returns ", returns.size(),
              " values but PyTorch's mode gave ", items.size());
  for (size_t i = 0; i < returns.size(); ++i) {
    stack.push_back(torch::jit::toIValue(items[i], returns[i].type()));
  }
  return stack;
}

}  // namespace

py::object answer_for_pytorch(const Policy& policy, py::handle op, py::tuple args, py::dict kwargs,
                              py::handle output, size_t call) {
  if (!py::hasattr(op, "_schema")) {  // a higher-order op: no schema to ask about
    return to_python(CheckpointPolicy::PreferRecompute);
  }
  const c10::FunctionSchema& schema = op.attr("_schema").cast<c10::FunctionSchema&>();
  std::optional<c10::OperatorHandle> handle =
      c10::Dispatcher::singleton().findSchema(schema.operator_name());
  if (!handle || !policy.decides_about(*handle)) {
    return to_python(CheckpointPolicy::PreferRecompute);
  }
  torch::jit::Stack arguments =
      torch::jit::createStackForSchema(handle->schema(), args, kwargs, std::nullopt);
  std::vector<c10::IValue> outputs = output_stack(handle->schema(), output);
  SelectiveCheckpointContext ctx;
  ctx.op_output = outputs;
  ctx.call = call;
  return to_python(policy.decide(ctx, *handle, arguments));
}

py::object to_python(CheckpointPolicy answer) {
  return checkpoint_module().attr("CheckpointPolicy")(static_cast<int>(answer));
}

CheckpointPolicy checkpoint_policy_from_python(py::handle answer, const c10::OperatorHandle* op) {
  if (py::isinstance<py::bool_>(answer)) {
    return detail::policy_from_bool(answer.cast<bool>());
  }
  py::object type = checkpoint_module().attr("CheckpointPolicy");
  TORCH_CHECK(py::isinstance(answer, type), "sac: a Python policy answered ",
              std::string(py::repr(answer)),
              op != nullptr ? " for " + toString(op->operator_name()) : std::string(),
              "; expected a torch.utils.checkpoint.CheckpointPolicy or a bool "
              "(True saves, False recomputes).");
  // PyTorch's enum and sac's list the six answers in the same order
  // (checked when the module loads).
  return static_cast<CheckpointPolicy>(answer.attr("value").cast<int>());
}

Policy policy_from_python(py::function fn) {
  std::shared_ptr<py::object> callable = owned(std::move(fn));
  return Policy::from_fn([callable](const SelectiveCheckpointContext& ctx,
                                    const c10::OperatorHandle& op,
                                    c10::ArrayRef<c10::IValue> args) {
    py::gil_scoped_acquire gil;
    py::list positional;
    py::dict keywords;
    const auto& arguments = op.schema().arguments();
    for (size_t i = 0; i < args.size(); ++i) {
      py::object value = torch::jit::toPyObject(args[i]);
      if (i < arguments.size() && arguments[i].kwarg_only()) {
        keywords[arguments[i].name().c_str()] = std::move(value);
      } else {
        positional.append(std::move(value));
      }
    }
    py::object python_ctx = checkpoint_module().attr("SelectiveCheckpointContext")(
        py::arg("is_recompute") = false, py::arg("op_output") = outputs(ctx.op_output));
    py::object answer = (*callable)(python_ctx, op_object(op), *positional, **keywords);
    return checkpoint_policy_from_python(answer, &op);
  });
}

}  // namespace sac::python
