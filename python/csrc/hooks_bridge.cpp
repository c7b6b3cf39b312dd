#include "hooks_bridge.h"

#include <sac/base/internal/saved_tensor_hooks.h>

#include <ATen/SavedTensorHooks.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace sac::python {
namespace {

// What a pack hook returns for a tensor sac's hooks took: the hooks that
// give it back.
struct PackedTensor {
  std::shared_ptr<torch::autograd::SavedVariableHooks> hooks;
};

class PythonBridge final : public sac::detail::SavedTensorHooksBridge {
 public:
  void push(sac::detail::SavedTensorHooksFactory factory) override {
    py::gil_scoped_acquire gil;
    auto make = std::make_shared<sac::detail::SavedTensorHooksFactory>(std::move(factory));
    py::cpp_function pack([make](const at::Tensor& tensor) -> py::object {
      std::shared_ptr<torch::autograd::SavedVariableHooks> hooks = (*make)();
      if (hooks == nullptr) {
        // Not sac's to hold: saved as it is, without its autograd metadata.
        // Autograd hands a pack hook an output with its grad_fn, and held so
        // it would hold the node that holds it: a cycle nothing frees.
        // tensor_data() makes no op call (aten::detach would: a profile
        // would count it).
        return py::cast(tensor.tensor_data());
      }
      {
        py::gil_scoped_release no_gil;
        hooks->call_pack_hook(tensor);
      }
      return py::cast(PackedTensor{std::move(hooks)});
    });
    py::cpp_function unpack([](py::handle packed) -> at::Tensor {
      if (THPVariable_Check(packed.ptr())) {
        return THPVariable_Unpack(packed.ptr());
      }
      auto hooks = packed.cast<const PackedTensor&>().hooks;
      py::gil_scoped_release no_gil;
      return hooks->call_unpack_hook();
    });
    hooks_module().attr("_push_saved_tensors_default_hooks")(pack, unpack);
  }

  void pop() override {
    py::gil_scoped_acquire gil;
    hooks_module().attr("_pop_saved_tensors_default_hooks")();
  }

  // torch's stack of hooks is set aside and put back, the thread's other
  // state (hooks disabled, tracing) left as it is.
  void hide() override {
    py::gil_scoped_acquire gil;
    at::impl::SavedTensorDefaultHooksTLS state = at::SavedTensorDefaultHooks::get_tls_state();
    hidden_.push_back(state.stack);
    state.stack = {};
    at::SavedTensorDefaultHooks::set_tls_state(state);
  }

  void show() override {
    py::gil_scoped_acquire gil;
    at::impl::SavedTensorDefaultHooksTLS state = at::SavedTensorDefaultHooks::get_tls_state();
    state.stack = std::move(hidden_.back());
    hidden_.pop_back();
    at::SavedTensorDefaultHooks::set_tls_state(state);
  }

 private:
  static py::object& hooks_module() {
    // Leaked: lives as long as the interpreter (see python_policy.cpp).
    static auto* module = new py::object(py::module_::import("torch._C._autograd"));
    return *module;
  }

  using Stack = decltype(at::impl::SavedTensorDefaultHooksTLS::stack);
  static thread_local std::vector<Stack> hidden_;
};

thread_local std::vector<PythonBridge::Stack> PythonBridge::hidden_;

}  // namespace

void install_hooks_bridge(py::module_& m) {
  py::class_<PackedTensor>(m, "_PackedTensor",
                           "A tensor saved for backward and held by sac's hooks.");
  // Leaked: the bridge lives as long as the process.
  sac::detail::set_saved_tensor_hooks_bridge(new PythonBridge());
}

}  // namespace sac::python
