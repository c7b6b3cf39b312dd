#include <sac/lab/internal/step_trace.h>

#include <sac/lab/memory.h>

#include <sac/base/internal/region_events.h>
#include <sac/dispatch/internal/boxed.h>
#include <sac/dispatch/internal/interceptor.h>
#include <sac/policy/internal/op_traits.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/PyObjectSlot.h>
#include <c10/util/Exception.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/profiler/orchestration/observer.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

namespace sac::detail {
namespace {

// Note [The step's memory shares the profiler's slot]
// c10 reports allocations and frees to whatever its thread's debug info holds
// under DebugInfoKind::PROFILER_STATE, and nowhere else; that slot is also
// where the profilers (torch.profiler, the legacy and RECORD_FUNCTION ones)
// keep their state, and their callbacks read whatever it holds *as* a
// profiler's state. So the tracer sits in the slot as a profiler that is
// disabled (torch::profiler::impl::ProfilerStateBase, ProfilerState::Disabled):
// a profiler started inside the step finds a valid state there and refuses
// to start ("Profiler is already enabled on this thread", kineto's and the
// legacy one's alike; sac adds what it means), and should one stack its
// state above the tracer's instead, the tracer sees that at the next op
// and refuses the step. A profiler running when the step begins is refused
// at once: its callbacks would read the tracer as their own state (before
// this note, a mutex in the tracer's memory, and an abort).

// Note [A handle Python keeps]
// A tensor's or a storage's Python object holds one handle on it, and while
// C++ holds another, the object holds its Python object alive in turn. Once
// nothing in Python refers to that Python object (the object's reference is
// its only one), its handle is no longer the program's. Without this, an
// input a Python program had let go of still looked held: a plan leaving a
// layer unchecked under autocast was predicted 3 KB high.
template <typename T>
uint32_t program_handles(const c10::weak_intrusive_ptr<T>& weak) {
  const uint32_t handles = weak.use_count();
  if (handles < 2) {
    return handles;  // no other handle keeps a Python object alive
  }
  // Alive while it has handles; only its Python object's count is read.
  const T* target = weak._unsafe_get_target();
  return handles - (target->pyobj_slot()->has_unique_reference() ? 1 : 0);
}

// Hears the step: c10's memory reports (allocations and frees, from any
// thread), this thread's region events and op calls.
class Tracer final : public MemoryListener, public detail::RegionEvents, public detail::OpObserver {
 public:
  explicit Tracer(c10::Device device) : MemoryListener(device) {}

  // ---- MemoryListener --------------------------------------------------------

  void heard(void* ptr, int64_t bytes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    watch_held(ptr, bytes);
    if (bytes > 0) {
      live_[ptr] = trace_.allocations.size();
      trace_.allocations.push_back({bytes, trace_.events.size()});
      trace_.events.push_back({trace_.allocations.size() - 1, bytes});
      return;
    }
    size_t allocation = kNever;
    if (const auto found = live_.find(ptr); found != live_.end()) {
      allocation = found->second;
      trace_.allocations[allocation].freed = trace_.events.size();
      live_.erase(found);
    }
    trace_.events.push_back({allocation, bytes});
  }

  // ---- detail::RegionEvents -------------------------------------------------

  void forward_began(const void* region) override {
    refuse_if(running_ >= 0,
              "a region began inside the forward of region " + std::to_string(running_) +
                  ": nested regions are not covered. Checkpoint the outer code alone, or "
                  "the inner regions alone");
    refuse_if(recomputing_ >= 0, "a region began inside the recomputation of region " +
                                     std::to_string(recomputing_) +
                                     ": nested regions are not covered");
    if (refused()) {
      return;
    }
    running_ = static_cast<int>(trace_.regions.size());
    index_[region] = running_;
    trace_.regions.emplace_back().forward_begin = position();
    mark(StepPhase::Kind::Forward, running_);
  }

  void forward_ended(const void* region) override {
    const int index = index_of(region);
    if (index < 0 || index != running_) {
      return;
    }
    trace_.regions[index].forward_end = position();
    running_ = -1;
    mark(StepPhase::Kind::Between, -1);
  }

  void recomputation_began(const void* region) override {
    const int index = index_of(region);
    if (index < 0) {
      return;  // a region from before the step: its ops are the step's code
    }
    refuse_if(running_ >= 0,
              "region " + std::to_string(index) + " was recomputed inside the forward of region " +
                  std::to_string(running_) + " (a backward inside a forward): not covered");
    refuse_if(trace_.regions[index].recompute_begin != kNever,
              "region " + std::to_string(index) +
                  " was recomputed twice (two backward passes through it): not covered");
    if (refused()) {
      return;
    }
    recomputing_ = index;
    trace_.regions[index].recompute_begin = position();
    mark(StepPhase::Kind::Backward, index);
    // sac's checkpoint isolates its recomputation, which hides the step's
    // observers: look inside. Not a guard: if the recomputation throws, its
    // isolation drops this. (PyTorch's checkpoint isolates nothing.)
    observing_recomputation_ = !detail::is_observing(this);
    if (observing_recomputation_) {
      detail::add_observer(this);
    }
  }

  void recomputation_ended(const void* region) override {
    const int index = index_of(region);
    if (index >= 0 && index == recomputing_) {
      if (observing_recomputation_) {
        detail::remove_observer(this);
      }
      trace_.regions[index].recompute_end = position();
      recomputing_ = -1;
    }
  }

  void released(const void* region) override {
    const int index = index_of(region);
    if (index >= 0) {
      trace_.regions[index].released = position();
      index_.erase(region);  // a new frame may take its address
    }
  }

  void input_held(const void* region, const at::Tensor& input, int64_t frame_handles) override {
    const int index = index_of(region);
    if (index < 0 || !input.has_storage() || input.storage().data() == nullptr) {
      return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    trace_.regions[index].inputs.emplace_back();
    held_.push_back(
        {static_cast<size_t>(index),
         trace_.regions[index].inputs.size() - 1,
         c10::weak_intrusive_ptr<c10::TensorImpl>(input.getIntrusivePtr()),
         input.is_view()
             ? c10::weak_intrusive_ptr<c10::TensorImpl>(input._base().getIntrusivePtr())
             : c10::weak_intrusive_ptr<c10::TensorImpl>(c10::intrusive_ptr<c10::TensorImpl>()),
         input.storage().getWeakStorageImpl(),
         input.storage().data(),
         frame_handles,
         {}});
  }

  void heard_whole(const void* region) override {
    const int index = index_of(region);
    if (index >= 0) {
      trace_.regions[index].heard_whole = true;
    }
  }

  void saved(const void* region, const at::Tensor& saved,
             std::weak_ptr<const void> holder) override {
    const int index = index_of(region);
    if (index < 0 || !saved.has_storage()) {
      return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    const void* data = saved.storage().data();
    for (Held& held : held_) {
      if (held.region == static_cast<size_t>(index) && held.data == data) {
        held.holders.push_back(holder);
      }
    }
    const auto found = data != nullptr ? live_.find(const_cast<void*>(data)) : live_.end();
    std::vector<TracedSave>& saves = trace_.regions[index].saves;
    saves.push_back({found != live_.end() ? found->second : kNever});
    saves_.push_back({static_cast<size_t>(index), saves.size() - 1, std::move(holder)});
  }

  void outputs_kept(size_t calls) override {
    refuse_if(calls > 0, "a region kept the outputs of " + std::to_string(calls) +
                             " op calls under its policy. Measure the step with every region "
                             "keeping nothing (no policy, or sac::nothing_saveable()): the "
                             "prediction adds what a plan keeps");
  }

  // ---- detail::OpObserver ---------------------------------------------------

  void before_op(const detail::ObservedOp&, c10::ArrayRef<c10::IValue>) override {
    check_slot();
    begins_.push_back(position());
  }

  void after_op(const detail::ObservedOp& call, c10::ArrayRef<c10::IValue> outputs) override {
    check_slot();
    if (begins_.empty()) {
      return;
    }
    const size_t begin = begins_.back();
    begins_.pop_back();
    if (!begins_.empty()) {
      return;  // inside another observed call: part of it
    }
    TracedRegion* region = nullptr;
    bool forward = false;
    if (running_ >= 0) {
      region = &trace_.regions[running_];
      forward = true;
    } else if (recomputing_ >= 0) {
      region = &trace_.regions[recomputing_];
    } else {
      return;
    }
    TracedCall traced;
    traced.begin = begin;
    traced.end = position();
    traced.random = detail::is_random(call.op);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& output : outputs) {
        detail::for_each_tensor(output, [&](const at::Tensor& t) {
          const void* data = t.has_storage() ? t.storage().data() : nullptr;
          const auto found = data != nullptr ? live_.find(const_cast<void*>(data)) : live_.end();
          traced.outputs.push_back(found != live_.end() ? found->second : kNever);
        });
      }
    }
    (forward ? region->forward : region->recompute)[call.op].push_back(std::move(traced));
  }

  // Whether c10's memory reports still come here: a profiler started inside
  // the step takes them (Note [The step's memory shares the profiler's slot]).
  void check_slot() {
    refuse_if(c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) != this,
              "a profiler was started inside the step, and c10 reports the step's "
              "allocations to the profiler on this thread, not to sac's recording, while it "
              "runs. Measure the step with no profiler, and profile another step");
  }

  StepTrace finish() {
    TORCH_CHECK(!refused(), "sac::measure_step_phases: ", refusal_, ".");
    close();
    return std::move(trace_);
  }

 private:
  size_t position() {
    std::lock_guard<std::mutex> lock(mutex_);
    return trace_.events.size();
  }

  int index_of(const void* region) const {
    const auto found = index_.find(region);
    return found == index_.end() ? -1 : found->second;
  }

  void refuse_if(bool condition, std::string why) {
    if (condition && refusal_.empty()) {
      refusal_ = std::move(why);
    }
  }
  bool refused() const { return !refusal_.empty(); }

  void mark(StepPhase::Kind kind, int region) {
    close();
    phase_ = StepPhase{kind, region, 0, position(), 0};
  }
  void close() {
    phase_.end = position();
    trace_.phases.push_back(phase_);
  }

  // Before each event (a free of `ptr` if `bytes` < 0): which saves
  // autograd let go of, and which held inputs the rest of the program let go
  // of (Note [A region left unchecked], plan_trace.cpp).
  void watch_held(void* ptr, int64_t bytes) {
    for (size_t i = 0; i < saves_.size();) {
      if (saves_[i].holder.expired()) {
        trace_.regions[saves_[i].region].saves[saves_[i].save].released = trace_.events.size();
        saves_[i] = std::move(saves_.back());
        saves_.pop_back();
      } else {
        ++i;
      }
    }
    for (auto it = held_.begin(); it != held_.end();) {
      HeldInput& input = trace_.regions[it->region].inputs[it->input];
      if (bytes < 0 && ptr == it->data) {
        input.freed = trace_.events.size();
        input.saved = !it->holders.empty();
        it = held_.erase(it);
        continue;
      }
      const size_t here = trace_.events.size();
      const TracedRegion& region = trace_.regions[it->region];
      // The rest of the program let go of it: first seen after the forward,
      // while the frame holds it (once the frame let go, the handles left
      // are the program's, whatever their number).
      if (input.dropped == kNever && region.forward_end != kNever && here >= region.forward_end &&
          region.released == kNever &&
          program_handles(it->impl) == static_cast<uint32_t>(it->frame_handles) &&
          (it->base.expired() || program_handles(it->base) == 1) &&
          program_handles(it->storage) == (it->base.expired() ? 1U : 2U)) {
        input.dropped = here;
      }
      // Autograd let go of what the region's forward saved of it.
      if (input.saves_released == kNever && !it->holders.empty() &&
          std::all_of(it->holders.begin(), it->holders.end(),
                      [](const auto& holder) { return holder.expired(); })) {
        input.saves_released = here;
      }
      ++it;
    }
  }

  struct Held {
    size_t region, input;
    c10::weak_intrusive_ptr<c10::TensorImpl> impl;
    // A view's base, which the view holds (its one handle then), and which
    // holds the storage too.
    c10::weak_intrusive_ptr<c10::TensorImpl> base;
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    const void* data;
    int64_t frame_handles;
    std::vector<std::weak_ptr<const void>> holders;  // of the forward's saves of it
  };

  struct Save {
    size_t region, save;
    std::weak_ptr<const void> holder;
  };

  std::vector<Held> held_;   // inputs held by frames, not yet freed
  std::vector<Save> saves_;  // forwards' saves autograd still holds
  std::mutex mutex_;         // the trace's events, allocations, live_, held_ and saves_
  StepTrace trace_;
  std::unordered_map<void*, size_t> live_;      // data pointer: its allocation
  std::unordered_map<const void*, int> index_;  // a region's frame: its index
  int running_ = -1;                            // the region whose forward runs
  int recomputing_ = -1;                        // the region whose recomputation runs
  bool observing_recomputation_ = false;        // added for it (an isolation hid the step's)
  std::vector<size_t> begins_;                  // of the observed calls running
  StepPhase phase_;
  std::string refusal_;
};

}  // namespace

MemoryListener::MemoryListener(c10::Device device)
    : ProfilerStateBase(
          torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::Disabled)),
      device_(device) {}

torch::profiler::impl::ActiveProfilerType MemoryListener::profilerType() {
  return torch::profiler::impl::ActiveProfilerType::NONE;
}

void MemoryListener::reportMemoryUsage(void* ptr, int64_t bytes, size_t /*total_allocated*/,
                                       size_t /*total_reserved*/, c10::Device device) {
  if (device.type() == device_.type() &&
      (!device_.has_index() || device.index() == device_.index()) && bytes != 0) {
    heard(ptr, bytes);
  }
}

std::vector<int64_t> StepTrace::live() const {
  std::vector<int64_t> live(events.size());
  int64_t bytes = 0;
  for (size_t e = 0; e < events.size(); ++e) {
    bytes += events[e].delta;
    live[e] = bytes;
  }
  return live;
}

void hear_memory(const std::shared_ptr<c10::DebugInfoBase>& listener, const char* api,
                 const std::function<void()>& step) {
  TORCH_CHECK(c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) == nullptr, api,
              ": a profiler is active on this thread (torch.profiler.profile, "
              "torch.autograd.profiler, or a RECORD_FUNCTION profiler). c10 reports "
              "allocations to the profiler's thread-local state alone, and sac needs that slot "
              "for the step (Note [The step's memory shares the profiler's slot], "
              "sac/lab/step_trace.cpp). Stop the profiler while measuring, and profile another "
              "step.");
  c10::DebugInfoGuard reporting(c10::DebugInfoKind::PROFILER_STATE, listener);
  try {
    step();
  } catch (c10::Error& e) {
    if (std::string(e.what_without_backtrace()).find("Profiler is already enabled") !=
        std::string::npos) {
      TORCH_RETHROW(e, api,
                    ": the step started a profiler, which cannot run while sac hears the "
                    "step's memory (Note [The step's memory shares the profiler's slot], "
                    "sac/lab/step_trace.cpp). Measure the step with no profiler, and profile "
                    "another step.");
    }
    throw;
  }
  TORCH_CHECK(c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) == listener.get(),
              api,
              ": a profiler was started inside the step, and c10 reports the step's "
              "allocations to the profiler on this thread, not to sac, while it runs. Measure "
              "the step with no profiler, and profile another step.");
}

void check_one_thread(const c10::Device& device, const char* api) {
  // c10's memory reporting is thread-local: the scratch buffers that CPU
  // kernels allocate on their intra-op worker threads are not reported, and
  // a plan's step can peak on one of them (a 40-byte buffer of a reduction
  // did, on Hugging Face's BART with two threads).
  TORCH_CHECK(device.type() != c10::kCPU || at::get_num_threads() == 1, api,
              ": the CPU runs ops on ", at::get_num_threads(),
              " intra-op threads, whose scratch allocations c10's memory reporting does not "
              "see from the step's thread, so the count would guess. Measure, and run the "
              "steps whose peak must hold, with one thread: at::set_num_threads(1) "
              "(torch.set_num_threads(1)).");
}

StepTrace trace_step(const MemoryProbe& probe, const std::function<void()>& step) {
  const bool probed = probe.live || probe.peak || probe.reset_peak;
  TORCH_CHECK(!probed || (probe.live && probe.peak && probe.reset_peak),
              "sac::measure_step_phases: the probe needs live, peak and reset_peak (or none: "
              "sac counts the step's memory from c10's memory reports alone).");
  TORCH_CHECK(probed || probe.device.type() == c10::kCPU, "sac::measure_step_phases: on ",
              probe.device, ", give the probe of its allocator (sac::device_memory_probe).");
  check_one_thread(probe.device, "sac::measure_step_phases");
  // Under per-op kernels, the cacheable ops must be intercepted to be seen.
  detail::intercept_ops_matching(&detail::is_cacheable);
  auto tracer = std::make_shared<Tracer>(probe.device);
  const int64_t base = probed ? probe.live() : 0;
  if (probed) {
    probe.reset_peak();
  }
  hear_memory(tracer, "sac::measure_step_phases", [&] {
    detail::RegionEventsGuard listening(tracer.get());
    detail::ObserverGuard observing(tracer.get());
    step();
  });
  // The probe checks that the reports missed nothing.
  const int64_t measured = probed ? probe.peak() - base : 0;
  StepTrace trace = tracer->finish();
  // What serving a kept random call allocates to restore a CPU generator,
  // as the allocator counts it (rounded to its blocks); on the CPU only.
  if (probe.device.type() == c10::kCPU) {
    trace.rng_state_bytes =
        measure_peak([] { (void)at::detail::getDefaultCPUGenerator().get_state(); });
  }
  trace.on_cpu = probe.device.type() == c10::kCPU;
  int64_t peak = 0;
  for (const int64_t bytes : trace.live()) {
    peak = std::max(peak, bytes);
  }
  TORCH_CHECK(!probed || peak == measured, "sac::measure_step_phases: the allocator of ",
              probe.device, " reported allocations that peak at ", peak,
              " bytes over the step's start, but "
              "the probe measured ",
              measured,
              ": the allocator does not report every "
              "allocation and free to c10's memory reporting (c10::reportMemoryUsageToProfiler), "
              "or the step allocated on another thread. The prediction would guess; it is not "
              "made. Use an allocator that reports (the CPU's default allocator and the "
              "counting allocator of examples/support.h do; CUDA's caching allocator does), and "
              "run the step on one thread.");
  for (size_t r = 0; r < trace.regions.size(); ++r) {
    TORCH_CHECK(trace.regions[r].forward_end != kNever, "sac::measure_step_phases: region ", r,
                "'s forward did not end in the step.");
  }
  return trace;
}

}  // namespace sac::detail
