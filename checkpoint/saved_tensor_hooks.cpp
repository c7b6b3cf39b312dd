#include <sac/checkpoint/saved_tensor_hooks.h>

#include <sac/checkpoint/error.h>
#include <sac/region/stash.h>

#include <torch/csrc/autograd/engine.h>

#include <mutex>
#include <utility>
#include <vector>

namespace sac::detail {
namespace {

thread_local std::vector<SavedTensorHooksFactory> tls_hooks;

class HookingEngine final : public torch::autograd::Engine {
 public:
  static Engine& get() {
    // Leaked: engines are process-lifetime objects, and the base engine's
    // worker threads may still reference thread-locals at exit.
    static HookingEngine* engine = new HookingEngine();
    return *engine;
  }

  std::unique_ptr<torch::autograd::SavedVariableHooks>
  get_default_saved_variable_hooks() override {
    if (tls_hooks.empty()) {
      return nullptr;
    }
    return tls_hooks.back()();
  }

 private:
  HookingEngine() = default;
};

}  // namespace

void install_hooking_engine() {
  static std::once_flag once;
  std::call_once(once, [] {
    using torch::autograd::Engine;
    Engine& current = Engine::get_default_engine();
    SAC_CHECKPOINT_CHECK(
        &current == &Engine::get_base_engine(),
        "sac: cannot install sac's saved-tensor hooks: the autograd engine of "
        "this process is not LibTorch's base engine (Python's torch module is "
        "loaded, or another library replaced the engine). sac::checkpoint "
        "needs the base engine; in a Python process use "
        "torch.utils.checkpoint instead.");
    torch::autograd::set_default_engine_stub(&HookingEngine::get);
  });
  // A failed check above leaves `once` unset, so the next call checks again;
  // a later replacement of the engine is caught here.
  SAC_CHECKPOINT_CHECK(
      &torch::autograd::Engine::get_default_engine() == &HookingEngine::get(),
      "sac: the autograd engine was replaced after sac installed its own; "
      "saved-tensor hooks would not run. Do not load Python's torch module "
      "(or another engine) into a process that uses sac::checkpoint.");
}

SavedTensorHooksGuard::SavedTensorHooksGuard(SavedTensorHooksFactory factory) {
  tls_hooks.push_back(std::move(factory));
}

SavedTensorHooksGuard::~SavedTensorHooksGuard() { tls_hooks.pop_back(); }

torch::autograd::SavedVariable save_kept(const at::Tensor& t) {
  // The thread's hooks are hidden while the SavedVariable is made, and come
  // back however it ends.
  struct HideThreadHooks {
    std::vector<SavedTensorHooksFactory> hidden = std::exchange(tls_hooks, {});
    ~HideThreadHooks() { tls_hooks = std::move(hidden); }
  } hide;
  torch::autograd::SavedVariable saved(t, /*is_output=*/false);
  if (TensorStash* stash = current_stash(); stash != nullptr && t.defined()) {
    saved.register_hooks(stash->hooks());
  }
  return saved;
}

}  // namespace sac::detail
