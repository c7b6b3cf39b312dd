#include <sac/checkpoint/internal/device_state.h>

#include <sac/base/internal/generators.h>

#include <ATen/Context.h>
#include <ATen/DeviceAccelerator.h>
#include <ATen/autocast_mode.h>

#include <algorithm>

namespace sac::detail {
namespace {

// The device type autocast is captured for besides the CPU, as PyTorch's
// checkpoint infers it (_infer_device_type): CUDA if any input is on it,
// else the first input's type that is not the CPU's (meta included), else
// CUDA. Autocast is captured only for a type that has it
// (is_autocast_available: not meta).
c10::DeviceType autocast_type(const std::vector<at::Tensor>& inputs) {
  std::optional<c10::DeviceType> first;
  for (const auto& t : inputs) {
    if (!t.defined() || t.device().is_cpu()) {
      continue;
    }
    if (t.device().is_cuda()) {
      return c10::DeviceType::CUDA;
    }
    if (!first.has_value()) {
      first = t.device().type();
    }
  }
  return first.value_or(c10::DeviceType::CUDA);
}

}  // namespace

ForwardState ForwardState::capture(const std::vector<at::Tensor>& inputs, bool preserve_rng) {
  std::vector<c10::Device> devices;
  for (const auto& t : inputs) {
    if (t.defined() && !t.device().is_cpu() && !t.device().is_meta()) {
      const auto device = t.device();
      if (std::find(devices.begin(), devices.end(), device) == devices.end()) {
        devices.push_back(device);
      }
    }
  }
  return capture_devices(autocast_type(inputs), devices, preserve_rng);
}

ForwardState ForwardState::capture_current(bool preserve_rng) {
  // Every device of the accelerator, not only the current one: the region
  // may run on any, and has no inputs that would say which.
  // An accelerator compiled in but without a device (a CUDA build of torch
  // on a machine without a driver) has no generator to capture: asking for
  // one initializes the device, and fails.
  const std::optional<c10::DeviceType> accelerator = at::getAccelerator(false);
  std::vector<c10::Device> devices;
  if (accelerator.has_value() &&
      at::globalContext().getAcceleratorHooksInterface(*accelerator).isAvailable()) {
    const auto count = static_cast<c10::DeviceIndex>(at::accelerator::deviceCount());
    for (c10::DeviceIndex i = 0; i < count; ++i) {
      devices.emplace_back(*accelerator, i);
    }
  }
  return capture_devices(accelerator.value_or(c10::DeviceType::CUDA), devices, preserve_rng);
}

ForwardState ForwardState::capture_devices(c10::DeviceType autocast_device,
                                           const std::vector<c10::Device>& devices,
                                           bool preserve_rng) {
  ForwardState state;
  std::vector<c10::DeviceType> autocast_types{c10::DeviceType::CPU};
  if (at::autocast::is_autocast_available(autocast_device)) {
    autocast_types.push_back(autocast_device);
  }
  for (const auto type : autocast_types) {
    state.autocast_.push_back(
        {type, at::autocast::is_autocast_enabled(type), at::autocast::get_autocast_dtype(type)});
  }
  state.autocast_cache_enabled_ = at::autocast::is_autocast_cache_enabled();

  if (preserve_rng) {
    std::vector<at::Generator> generators{
        at::globalContext().defaultGenerator(c10::Device(c10::DeviceType::CPU))};
    for (const auto& device : devices) {
      generators.push_back(at::globalContext().defaultGenerator(device));
    }
    state.add_generators(generators);
  }
  return state;
}

void ForwardState::add_generators(const std::vector<at::Generator>& generators) {
  for (const auto& live : generators) {
    generators_.emplace_back(live, locked_clone(live));
  }
}

ForwardState::Restore::Restore(const ForwardState& state)
    : autocast_cache_enabled_(at::autocast::is_autocast_cache_enabled()) {
  // Everything that allocates comes first: a failure then leaves every
  // generator as it was, and the destructor allocates nothing.
  std::vector<at::Tensor> forward_states;
  for (const auto& [live, saved] : state.generators_) {
    previous_generators_.emplace_back(live, locked_state(live));
    forward_states.push_back(locked_state(saved));
  }
  for (size_t i = 0; i < forward_states.size(); ++i) {
    locked_set_state(previous_generators_[i].first, forward_states[i]);
  }
  for (const auto& forward : state.autocast_) {
    autocast_.push_back({forward.device_type,
                         at::autocast::is_autocast_enabled(forward.device_type),
                         at::autocast::get_autocast_dtype(forward.device_type)});
    at::autocast::set_autocast_enabled(forward.device_type, forward.enabled);
    at::autocast::set_autocast_dtype(forward.device_type, forward.dtype);
  }
  at::autocast::set_autocast_cache_enabled(state.autocast_cache_enabled_);
  at::autocast::increment_nesting();
}

ForwardState::Restore::~Restore() {
  // As torch.autocast's exit: the cast cache lives until the outermost exit.
  if (at::autocast::decrement_nesting() == 0) {
    at::autocast::clear_cache();
  }
  at::autocast::set_autocast_cache_enabled(autocast_cache_enabled_);
  for (auto it = autocast_.rbegin(); it != autocast_.rend(); ++it) {
    at::autocast::set_autocast_enabled(it->device_type, it->enabled);
    at::autocast::set_autocast_dtype(it->device_type, it->dtype);
  }
  for (const auto& [live, previous] : previous_generators_) {
    locked_set_state(live, previous);
  }
}

}  // namespace sac::detail
