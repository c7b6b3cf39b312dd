#include <sac/lab/memory.h>

#include <sac/lab/internal/step_trace.h>

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <memory>
#include <mutex>

namespace sac {
namespace {

// Counts what c10 reports of its device.
class PeakListener final : public detail::MemoryListener {
 public:
  using MemoryListener::MemoryListener;

  int64_t peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    return peak_;
  }

 private:
  void heard(void* /*ptr*/, int64_t bytes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    live_ += bytes;
    peak_ = std::max(peak_, live_);
  }

  std::mutex mutex_;  // reports may come from other threads
  int64_t live_ = 0;
  int64_t peak_ = 0;
};

}  // namespace

int64_t measure_peak(const std::function<void()>& fn, c10::Device device) {
  detail::check_one_thread(device, "sac::measure_peak");
  auto listener = std::make_shared<PeakListener>(device);
  detail::hear_memory(listener, "sac::measure_peak", fn);
  return listener->peak();
}

MemoryProbe device_memory_probe(c10::Device device) {
  TORCH_CHECK(device.type() != c10::DeviceType::CPU,
              "sac::device_memory_probe: the CPU has no caching device allocator to read; on the "
              "CPU, give sac::MemoryProbe your allocator's counters (examples/memory_meter.h).");
  c10::Allocator* registered = nullptr;
  try {
    registered = c10::GetAllocator(device.type());
  } catch (const c10::Error&) {  // none registered: c10 asserts
  }
  auto* allocator = dynamic_cast<c10::DeviceAllocator*>(registered);
  TORCH_CHECK(allocator != nullptr, "sac::device_memory_probe: ", device.type(),
              " has no caching device allocator (",
              registered == nullptr ? "none is registered: is its backend loaded?"
                                    : "its allocator is not a c10::DeviceAllocator",
              "), so there are no statistics to read; give sac::MemoryProbe the allocator's "
              "counters yourself.");
  const c10::DeviceIndex index = device.has_index() ? device.index() : 0;
  constexpr size_t kAll = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  return {
      [allocator, index] { return allocator->getDeviceStats(index).allocated_bytes[kAll].current; },
      [allocator, index] { return allocator->getDeviceStats(index).allocated_bytes[kAll].peak; },
      [allocator, index] { allocator->resetPeakStats(index); },
      [allocator, index] {
        const auto stats = allocator->getDeviceStats(index);
        const int64_t cached =
            stats.reserved_bytes[kAll].current - stats.allocated_bytes[kAll].current;
        return static_cast<int64_t>(allocator->getMemoryInfo(index).first) + cached;
      }};
}

}  // namespace sac
