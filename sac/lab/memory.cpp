#include <sac/lab/memory.h>

#include <sac/lab/internal/step_trace.h>

#include <torch/csrc/profiler/orchestration/observer.h>

#include <algorithm>
#include <memory>
#include <mutex>

namespace sac {
namespace {

// Counts what c10 reports of `device`, as a disabled profiler (Note [The
// step's memory shares the profiler's slot]).
class PeakListener final : public torch::profiler::impl::ProfilerStateBase {
 public:
  explicit PeakListener(c10::Device device)
      : ProfilerStateBase(
            torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::Disabled)),
        device_(device) {}

  torch::profiler::impl::ActiveProfilerType profilerType() override {
    return torch::profiler::impl::ActiveProfilerType::NONE;
  }
  bool memoryProfilingEnabled() const override { return true; }

  void reportMemoryUsage(void* /*ptr*/, int64_t bytes, size_t /*total_allocated*/,
                         size_t /*total_reserved*/, c10::Device device) override {
    if (device.type() != device_.type() ||
        (device_.has_index() && device.index() != device_.index())) {
      return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    live_ += bytes;
    peak_ = std::max(peak_, live_);
  }

  int64_t peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    return peak_;
  }

 private:
  const c10::Device device_;
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
