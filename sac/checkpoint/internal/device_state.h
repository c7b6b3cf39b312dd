// The global state a recomputation must see as the forward saw it: random
// generators and autocast.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <optional>
#include <vector>

namespace sac::detail {

// Autocast's settings for one device type.
struct AutocastSetting {
  c10::DeviceType device_type;
  bool enabled;
  c10::ScalarType dtype;
};

// A default generator and a snapshot of its state (Generator::clone).
using GeneratorState = std::pair<at::Generator, at::Generator>;

// Snapshot of the state at the start of a checkpointed forward.
class ForwardState {
 public:
  // Captures autocast (CPU and the device type PyTorch's checkpoint infers
  // from the inputs: CUDA by default) and, if `preserve_rng`, the CPU
  // generator and the default generator of each accelerator device among
  // `inputs` (as PyTorch does, only those devices).
  static ForwardState capture(const std::vector<at::Tensor>& inputs, bool preserve_rng);
  // For a region without inputs: the CPU and, if this process has one,
  // every device of the accelerator (autocast: its type, else CUDA).
  static ForwardState capture_current(bool preserve_rng);

  // Also snapshots `generators` (each restored with the others). The
  // generators of devices this machine lacks are made by the same API, so
  // tests stand CPU generators in for them.
  void add_generators(const std::vector<at::Generator>& generators);

  // While alive: the forward's generator states and autocast settings are
  // current; on destruction the ones that were current before come back.
  class Restore {
   public:
    explicit Restore(const ForwardState& state);
    ~Restore();
    Restore(const Restore&) = delete;
    Restore& operator=(const Restore&) = delete;

   private:
    // What was current before, to put back: each generator and its state.
    std::vector<std::pair<at::Generator, at::Tensor>> previous_generators_;
    std::vector<AutocastSetting> autocast_;
    bool autocast_cache_enabled_;
  };

 private:
  static ForwardState capture_devices(c10::DeviceType autocast_device,
                                      const std::vector<c10::Device>& devices, bool preserve_rng);

  std::vector<GeneratorState> generators_;
  std::vector<AutocastSetting> autocast_;
  bool autocast_cache_enabled_ = true;
};

}  // namespace sac::detail
