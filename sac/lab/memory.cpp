#include <sac/lab/memory.h>

#include <sac/lab/internal/step_trace.h>

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

}  // namespace sac
