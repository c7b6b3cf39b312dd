// sac::measure_peak: what a function allocates at most, as c10's memory
// reports tell it, with no allocator of one's own to install; and
// sac::MemoryProbe, an allocator's own counters (device_memory_probe reads a
// caching device allocator's).
//
//   at::set_num_threads(1);
//   const int64_t peak = sac::measure_peak([&] { step(); });
//   // bytes over what was live when the step began
//
// c10's allocators report each allocation and free to the calling thread's
// profiler slot while someone listens there: the CPU's default allocator,
// the counting allocator of examples/support.h, CUDA's caching allocator.
// sac listens (Note [The step's memory shares the profiler's slot] in
// sac/lab/step_trace.cpp), so a peak counts every byte the function
// allocates on this thread, over its start: what was live before it is not
// known on the CPU. On an accelerator the allocator knows its live bytes
// too: MemoryProbe::live of sac::device_memory_probe gives the absolute
// count (add it to the peak).
//
// Refused: a profiler running on the thread (it holds the slot), and a CPU
// on several intra-op threads (their scratch buffers are not reported).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>

namespace sac {

// Live bytes and the peak since the last reset, of the allocator the step
// uses: a counting allocator on CPU (examples/memory_meter.h; optional
// there), the caching allocator's statistics on an accelerator
// (device_memory_probe). The step is traced from the reports of `device`'s
// allocator; the probe's peak checks that they missed nothing.
struct MemoryProbe {
  std::function<int64_t()> live;
  std::function<int64_t()> peak;
  std::function<void()> reset_peak;
  // Bytes the allocator could still hand out, if it knows: a peak budget
  // read at solve time is free() less a margin (sac/lab/shape_plans.h).
  std::function<int64_t()> free;
  c10::Device device = c10::kCPU;
};

// The probe of `device`'s caching allocator (CUDA's, or any registered
// c10::DeviceAllocator): live and peak are its allocated bytes; free is the
// device's free memory plus what the allocator has reserved and not handed
// out. A clear error for the CPU or a device type without such an allocator.
MemoryProbe device_memory_probe(c10::Device device);

// The most `fn` had live at once on `device`, over what was live when it
// began.
int64_t measure_peak(const std::function<void()>& fn, c10::Device device = c10::kCPU);

}  // namespace sac
