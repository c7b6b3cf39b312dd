// The registry: the mechanism in use and the kernels it placed. See
// Note [The registry].
#include <sac/dispatch/internal/registry.h>

#include <sac/dispatch/internal/interceptor.h>
#include <sac/dispatch/internal/factory_ops.h>
#include <sac/dispatch/mechanism.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace sac::detail {
namespace {

// Set once sac's own fallback is registered on kFallbackKey.
std::atomic<bool> fallback_registered{false};

// Remembers ops defined after a filter was installed; they are registered
// at the next interceptor activation, because the dispatcher calls listeners
// under the lock that registerImpl takes.
class NewOpListener final : public c10::OpRegistrationListener {
 public:
  explicit NewOpListener(std::function<void(c10::OperatorName)> on_new)
      : on_new_(std::move(on_new)) {}
  void onOperatorRegistered(const c10::OperatorHandle& op) override { on_new_(op.operator_name()); }
  void onOperatorDeregistered(const c10::OperatorHandle&) override {}

 private:
  std::function<void(c10::OperatorName)> on_new_;
};

// Process-wide state. Leaked on purpose: the dispatcher may outlive any
// static destructor order we could choose.
class Registry {
 public:
  static Registry& get() {
    static Registry* registry = new Registry();
    return *registry;
  }

  dispatch::Mechanism resolve() {
    std::lock_guard<std::mutex> lock(mutex_);
    return resolve_locked();
  }

  void set(std::optional<dispatch::Mechanism> requested) {
    std::lock_guard<std::mutex> lock(mutex_);
    const dispatch::Mechanism wanted = requested.has_value() ? *requested : automatic_locked();
    if (in_use_) {
      TORCH_CHECK(!mechanism_.has_value() || *mechanism_ == wanted,
                  "sac: cannot switch the dispatch mechanism to ", to_string(wanted), ": ",
                  to_string(*mechanism_),
                  " is already in use in this process. Choose the mechanism "
                  "before the first checkpoint (sac::dispatch::set_mechanism or "
                  "SAC_DISPATCH=per_op|fallback|auto).");
      return;
    }
    mechanism_.reset();
    adopt_locked(wanted, requested.has_value() ? "set_mechanism" : "auto");
  }

  void intercept(c10::ArrayRef<c10::OperatorHandle> ops) {
    std::lock_guard<std::mutex> lock(mutex_);
    in_use_ = true;
    if (resolve_locked() != dispatch::Mechanism::PerOpKernels) {
      return;
    }
    for (const auto& op : ops) {
      register_kernel_locked(op);
    }
  }

  void intercept_matching(OpFilter filter) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      in_use_ = true;
      if (resolve_locked() != dispatch::Mechanism::PerOpKernels ||
          std::find(filters_.begin(), filters_.end(), filter) != filters_.end()) {
        return;
      }
      filters_.push_back(filter);
    }
    // The dispatcher replays every existing op to a new listener, and calls
    // it under its own lock: added once, outside ours.
    bool added = false;
    std::call_once(listener_once_, [&] {
      listener_ = new c10::RegistrationHandleRAII(
          c10::Dispatcher::singleton().addRegistrationListener(std::make_unique<NewOpListener>(
              [this](c10::OperatorName name) { note_new_op(std::move(name)); })));
      added = true;
    });
    std::lock_guard<std::mutex> lock(mutex_);
    if (!added) {
      // Existing ops must be checked against the new filter too.
      for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
        pending_.push_back(name);
      }
    }
    register_pending_locked();
  }

  void on_activation() {
    if (has_pending_.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(mutex_);
      register_pending_locked();
    }
  }

  // The mechanism once something was intercepted, without a lock; else
  // nothing.
  std::optional<dispatch::Mechanism> activated() const {
    if (activated_.load(std::memory_order_acquire)) {
      return *mechanism_;
    }
    return std::nullopt;
  }

  dispatch::Mechanism activate() {
    // Fast path: the mechanism is fixed after the first activation.
    if (activated_.load(std::memory_order_acquire)) {
      on_activation();
      return *mechanism_;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    in_use_ = true;
    const dispatch::Mechanism m = resolve_locked();
    activated_.store(true, std::memory_order_release);
    register_pending_locked();
    return m;
  }

 private:
  Registry() = default;

  dispatch::Mechanism automatic_locked() const {
    return fallback_key_available(nullptr) ? dispatch::Mechanism::FallbackKey
                                           : dispatch::Mechanism::PerOpKernels;
  }

  dispatch::Mechanism resolve_locked() {
    if (mechanism_.has_value()) {
      return *mechanism_;
    }
    const char* env = std::getenv("SAC_DISPATCH");
    const std::string value = env == nullptr ? "auto" : env;
    if (value == "per_op") {
      adopt_locked(dispatch::Mechanism::PerOpKernels, "SAC_DISPATCH=per_op");
    } else if (value == "fallback") {
      adopt_locked(dispatch::Mechanism::FallbackKey, "SAC_DISPATCH=fallback");
    } else if (value == "auto" || value.empty()) {
      adopt_locked(automatic_locked(), "auto");
    } else {
      TORCH_CHECK(false, "sac: SAC_DISPATCH='", value,
                  "' is not a dispatch mechanism. Use per_op (a kernel on "
                  "ADInplaceOrView for each needed op), fallback (one fallback "
                  "on the Fake key) or auto.");
    }
    return *mechanism_;
  }

  void adopt_locked(dispatch::Mechanism m, const char* requested_by) {
    if (m == dispatch::Mechanism::FallbackKey && !fallback_.has_value()) {
      std::string reason;
      TORCH_CHECK(fallback_key_available(&reason), "sac: ", requested_by,
                  " asks for the fallback-key dispatch mechanism, but ", reason,
                  ". Use the per-op mechanism instead (SAC_DISPATCH=per_op).");
      fallback_.emplace(c10::Dispatcher::singleton().registerFallback(
          kFallbackKey,
          c10::KernelFunction::makeFromBoxedFunction<&intercepting_kernel<kFallbackKey>>(),
          "sac: selective activation checkpointing (fallback below autograd)"));
      fallback_registered.store(true);
    }
    mechanism_ = m;
  }

  void note_new_op(c10::OperatorName name) {
    // Called by the dispatcher, possibly while this registry's mutex is held
    // by intercept_matching (which unlocks before adding the listener), so it
    // takes its own lock.
    std::lock_guard<std::mutex> lock(pending_mutex_);
    incoming_.push_back(std::move(name));
    has_pending_.store(true, std::memory_order_release);
  }

  void register_pending_locked() {
    {
      std::lock_guard<std::mutex> lock(pending_mutex_);
      for (auto& name : incoming_) {
        pending_.push_back(std::move(name));
      }
      incoming_.clear();
      has_pending_.store(false, std::memory_order_release);
    }
    auto& dispatcher = c10::Dispatcher::singleton();
    for (const auto& name : pending_) {
      if (kernels_.count(name) != 0) {
        continue;
      }
      auto op = dispatcher.findSchema(name);
      if (!op.has_value()) {
        continue;
      }
      // Ops with LibTorch's own ADInplaceOrView kernel stay out of reach.
      if (op->hasKernelForDispatchKey(kPerOpKey)) {
        continue;
      }
      for (const auto& filter : filters_) {
        if (filter(*op)) {
          register_kernel_locked(*op);
          break;
        }
      }
    }
    pending_.clear();
  }

  void register_kernel_locked(const c10::OperatorHandle& op) {
    const auto& name = op.operator_name();
    if (kernels_.count(name) != 0) {
      return;
    }
    TORCH_CHECK(!op.hasKernelForDispatchKey(kPerOpKey), "sac: cannot intercept ", name,
                ": LibTorch registers its own ADInplaceOrView kernel for "
                "it (it is a view, in-place or out= op), and sac never replaces "
                "a LibTorch kernel. Such ops are always recomputed.");
    kernels_.emplace(
        name, c10::Dispatcher::singleton().registerImpl(
                  name, kPerOpKey,
                  c10::KernelFunction::makeFromBoxedFunction<&intercepting_kernel<kPerOpKey>>(),
                  std::nullopt, nullptr,
                  "sac: selective activation checkpointing (per-op kernel below "
                  "autograd)"));
  }

  std::mutex mutex_;
  std::optional<dispatch::Mechanism> mechanism_;
  bool in_use_ = false;
  std::atomic<bool> activated_{false};
  std::optional<c10::RegistrationHandleRAII> fallback_;
  std::unordered_map<c10::OperatorName, c10::RegistrationHandleRAII> kernels_;
  std::vector<OpFilter> filters_;
  std::once_flag listener_once_;
  c10::RegistrationHandleRAII* listener_ = nullptr;  // leaked with the registry
  std::vector<c10::OperatorName> pending_;

  std::mutex pending_mutex_;
  std::vector<c10::OperatorName> incoming_;
  std::atomic<bool> has_pending_{false};
};

}  // namespace

bool own_fallback_registered() { return fallback_registered.load(std::memory_order_relaxed); }

void activate_interception() { Registry::get().activate(); }

c10::DispatchKey interception_key(dispatch::Mechanism mechanism) {
  return mechanism == dispatch::Mechanism::FallbackKey ? kFallbackKey : kPerOpKey;
}

}  // namespace sac::detail

namespace sac::dispatch {

std::string_view to_string(Mechanism mechanism) {
  switch (mechanism) {
    case Mechanism::PerOpKernels: return "per-op kernels on ADInplaceOrView";
    case Mechanism::FallbackKey: return "fallback on the Fake key";
  }
  return "unknown";
}

void set_mechanism(std::optional<Mechanism> mechanism) { detail::Registry::get().set(mechanism); }

Mechanism mechanism() { return detail::Registry::get().resolve(); }

}  // namespace sac::dispatch

namespace sac::detail {

bool fallback_key_available(std::string* reason) {
  auto& dispatcher = c10::Dispatcher::singleton();
  // Our own fallback, once registered, does not make the key unavailable.
  if (own_fallback_registered()) {
    return true;
  }
  if (dispatcher.hasBackendFallbackForDispatchKey(kFallbackKey)) {
    if (reason != nullptr) {
      *reason = "LibTorch (or another library) already registers a fallback "
                "on DispatchKey::Fake";
    }
    return false;
  }
  const auto ops = dispatcher.getAllOpNamesForDispatchKey(kFallbackKey);
  if (!ops.empty()) {
    if (reason != nullptr) {
      *reason = "operators such as " + c10::toString(ops.front()) +
                " have kernels on DispatchKey::Fake, which a fallback there "
                "would not see";
    }
    return false;
  }
  return true;
}

bool mechanism_misses(const c10::OperatorHandle& op) {
  // Asked for every call a callback keeps: under the fallback key, once
  // active, one load.
  const std::optional<dispatch::Mechanism> active = Registry::get().activated();
  if (active == dispatch::Mechanism::FallbackKey) {
    return false;
  }
  return per_op_kernels_miss(op) && (active.has_value() ? *active : dispatch::mechanism()) ==
                                        dispatch::Mechanism::PerOpKernels;
}

void intercept_ops(c10::ArrayRef<c10::OperatorHandle> ops) { Registry::get().intercept(ops); }

void intercept_ops_matching(OpFilter filter) { Registry::get().intercept_matching(filter); }

}  // namespace sac::detail
