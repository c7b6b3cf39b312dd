#include <sac/base/internal/saved_tensor_hooks.h>

#include <sac/base/internal/check.h>
#include <sac/base/internal/stash.h>
#include <sac/dispatch/internal/carried.h>
#include <sac/dispatch/internal/interceptor.h>

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/variable.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace sac::detail {
namespace {

thread_local std::vector<SavedTensorHooksFactory> tls_hooks;
std::atomic<SavedTensorHooksBridge*> the_bridge{nullptr};
std::atomic<bool> engine_installed{false};
// Set while save_unhooked saves without the thread's hooks.
thread_local bool tls_hidden = false;

// The innermost hooks of a thread that called backward, for the threads that
// run its nodes (sac/dispatch/internal/carried.h). They pack into one region from
// several threads, which take turns.
struct CarriedHooks {
  SavedTensorHooksFactory factory;
  std::shared_ptr<std::recursive_mutex> turns = std::make_shared<std::recursive_mutex>();
};
constexpr std::string_view kCarriedName = "sac::SavedTensorHooks";
const c10::DebugInfoKind kCarriedKind(&kCarriedName);

class TakingTurns final : public torch::autograd::SavedVariableHooks {
 public:
  TakingTurns(std::unique_ptr<SavedVariableHooks> hooks,
              std::shared_ptr<std::recursive_mutex> turns)
      : hooks_(std::move(hooks)), turns_(std::move(turns)) {}
  void call_pack_hook(const at::Tensor& tensor) override {
    std::lock_guard<std::recursive_mutex> turn(*turns_);
    hooks_->call_pack_hook(tensor);
  }
  at::Tensor call_unpack_hook() override {
    std::lock_guard<std::recursive_mutex> turn(*turns_);
    return hooks_->call_unpack_hook();
  }

 private:
  std::unique_ptr<SavedVariableHooks> hooks_;
  std::shared_ptr<std::recursive_mutex> turns_;
};

class HookingEngine final : public torch::autograd::Engine {
 public:
  static Engine& get() {
    // Leaked: engines are process-lifetime objects, and the base engine's
    // worker threads may still reference thread-locals at exit.
    static HookingEngine* engine = new HookingEngine();
    return *engine;
  }

  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    if (tls_hidden) {
      return nullptr;
    }
    if (!tls_hooks.empty()) {
      return tls_hooks.back()();
    }
    const CarriedHooks* carried = detail::carried<CarriedHooks>(kCarriedKind);
    if (carried == nullptr) {
      return nullptr;
    }
    auto hooks = carried->factory();
    return hooks == nullptr ? nullptr
                            : std::make_unique<TakingTurns>(std::move(hooks), carried->turns);
  }

  // sac's thread-local state goes with the backward to every thread that runs
  // its nodes, as at::ThreadLocalState takes PyTorch's own (the graph task
  // captures it in Engine::execute). This thread, which runs the CPU nodes,
  // goes through it too, so that all of them take turns.
  torch::autograd::variable_list execute(const torch::autograd::edge_list& roots,
                                         const torch::autograd::variable_list& inputs,
                                         bool keep_graph, bool create_graph, bool accumulate_grad,
                                         const torch::autograd::edge_list& outputs) override {
    detail::CarryToEngineThreads interception;
    CarryStash stash;
    std::optional<CarriedGuard<CarriedHooks>> hooks;
    std::vector<SavedTensorHooksFactory> own;
    if (!tls_hooks.empty() && !tls_hidden) {
      hooks.emplace(kCarriedKind, CarriedHooks{tls_hooks.back()});
      own = std::exchange(tls_hooks, {});
    }
    struct Restore {
      std::vector<SavedTensorHooksFactory>& own;
      ~Restore() {
        if (!own.empty()) {
          tls_hooks = std::move(own);
        }
      }
    } restore{own};
    return Engine::execute(roots, inputs, keep_graph, create_graph, accumulate_grad, outputs);
  }

 private:
  HookingEngine() = default;
};

}  // namespace

void install_hooking_engine() {
  if (the_bridge.load() != nullptr) {
    return;
  }
  static std::once_flag once;
  std::call_once(once, [] {
    using torch::autograd::Engine;
    Engine& current = Engine::get_default_engine();
    SAC_CHECKPOINT_CHECK(
        &current == &Engine::get_base_engine(),
        "sac: cannot install sac's saved-tensor hooks: the autograd engine of "
        "this process is not LibTorch's base engine (Python's torch module is "
        "loaded, or another library replaced the engine). sac::checkpoint "
        "needs the base engine; in a Python process, import torch_sac (sac's Python "
        "package), which hands sac's hooks to Python's engine.");
    torch::autograd::set_default_engine_stub(&HookingEngine::get);
    engine_installed = true;
  });
  // A failed check above leaves `once` unset, so the next call checks again;
  // a later replacement of the engine is caught here.
  SAC_CHECKPOINT_CHECK(&torch::autograd::Engine::get_default_engine() == &HookingEngine::get(),
                       "sac: the autograd engine was replaced after sac installed its own; "
                       "saved-tensor hooks would not run. Do not load Python's torch module "
                       "(or another engine) into a process that uses sac::checkpoint.");
}

void set_saved_tensor_hooks_bridge(SavedTensorHooksBridge* bridge) {
  TORCH_CHECK(bridge != nullptr, "sac: set_saved_tensor_hooks_bridge(nullptr)");
  TORCH_CHECK(!engine_installed.load(),
              "sac: a saved-tensor hooks bridge was set after sac installed its "
              "own autograd engine; set it before the first checkpoint.");
  SavedTensorHooksBridge* none = nullptr;
  TORCH_CHECK(the_bridge.compare_exchange_strong(none, bridge),
              "sac: a saved-tensor hooks bridge is set already.");
}

SavedTensorHooksGuard::SavedTensorHooksGuard(SavedTensorHooksFactory factory)
    : bridge_(the_bridge.load()) {
  if (bridge_ != nullptr) {
    bridge_->push(std::move(factory));
  } else {
    tls_hooks.push_back(std::move(factory));
  }
}

SavedTensorHooksGuard::~SavedTensorHooksGuard() {
  if (bridge_ != nullptr) {
    bridge_->pop();
  } else {
    tls_hooks.pop_back();
  }
}

namespace {

// Hides the thread's hooks (its own and carried) while alive, and shows them
// again however the scope ends.
struct HideThreadHooks {
  SavedTensorHooksBridge* bridge = the_bridge.load();
  bool was_hidden = false;
  HideThreadHooks() {
    if (bridge != nullptr) {
      bridge->hide();
    }
    was_hidden = std::exchange(tls_hidden, true);
  }
  ~HideThreadHooks() {
    if (bridge != nullptr) {
      bridge->show();
    }
    tls_hidden = was_hidden;
  }
  HideThreadHooks(const HideThreadHooks&) = delete;
  HideThreadHooks& operator=(const HideThreadHooks&) = delete;
};

}  // namespace

torch::autograd::SavedVariable save_unhooked(const at::Tensor& t) {
  const HideThreadHooks hide;
  torch::autograd::SavedVariable saved(t, /*is_output=*/false);
  if (TensorStash* stash = current_stash(); stash != nullptr && t.defined()) {
    saved.register_hooks(stash->hooks());
  }
  return saved;
}

bool grad_fn_is_stale(const at::Tensor& t) {
  if (!t.defined() || !t.is_view()) {
    return false;
  }
  const auto* view = torch::autograd::impl::get_view_autograd_meta(t);
  return view != nullptr && view->has_bw_view() && view->get_attr_version() != t._version();
}

torch::autograd::SavedVariable save_input(const at::Tensor& t) {
  if (!grad_fn_is_stale(t)) {
    return torch::autograd::SavedVariable(t, /*is_output=*/false);
  }
  // The thread's hooks still pack it once, as they would pack the
  // SavedVariable (under no grad), so that what they count (an enclosing
  // region's holders, in its forward and in its recomputation, where the
  // view is no longer stale) is the same; what they keep is dropped.
  if (auto hooks =
          torch::autograd::Engine::get_default_engine().get_default_saved_variable_hooks()) {
    const at::NoGradGuard no_grad;
    hooks->call_pack_hook(t);
  }
  const HideThreadHooks hide;
  return torch::autograd::SavedVariable(t, /*is_output=*/false);
}

}  // namespace sac::detail
