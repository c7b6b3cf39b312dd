// The memory meter of examples/gpt_train and benchmarks/gpt_step.
#pragma once

#include "examples/support.h"

#include <ATen/DeviceAccelerator.h>
#include <torch/torch.h>

#include <cstdint>

namespace sac_examples {

// Bytes allocated on the training device, live and peak: exact on CPU (the
// counting allocator), the caching allocator's statistics on CUDA.
class MemoryMeter {
 public:
  explicit MemoryMeter(const torch::Device& device) : device_(device) {
    if (device_.is_cpu()) CountingAllocator::install();
  }
  int64_t live() const {
    return device_.is_cpu() ? CountingAllocator::live_bytes() : device_bytes().current;
  }
  int64_t peak() const {
    return device_.is_cpu() ? CountingAllocator::peak_bytes() : device_bytes().peak;
  }
  void reset_peak() {
    if (device_.is_cpu()) {
      CountingAllocator::reset_peak();
    } else {
      at::accelerator::resetPeakStats(device_.index());
    }
  }

 private:
  c10::CachingAllocator::Stat device_bytes() const {
    const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    return at::accelerator::getDeviceStats(device_.index()).allocated_bytes[aggregate];
  }
  torch::Device device_;
};

}  // namespace sac_examples
