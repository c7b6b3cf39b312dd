// The accelerator operations behind sac's host copies: streams, events,
// allocation on a stream, copies queued on a stream, and recordStream.
//
// host_memory() (copy_target.h) orders its copies only through this
// interface, so that the order can be checked on a machine without an
// accelerator: tests give host_memory(ops) a fake whose "device" tensors
// are CPU tensors and which logs each operation (tests/base_host_memory_test.cpp).
// The real one, device_ops(), runs them through c10's VirtualGuardImpl for
// the tensor's device type and the device's caching allocator.
#pragma once

#include <sac/base/copy_target.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <memory>

namespace sac::detail {

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;

  // Whether `t` lies on a device this implementation copies from: a strided
  // tensor of an accelerator with streams (not the CPU, not meta).
  virtual bool on_device(const at::Tensor& t) const = 0;
  // The stream work on `device` is queued on now.
  virtual c10::Stream current_stream(c10::Device device) = 0;
  // A stream of sac's own on `device` for copies to the host (`to_host`)
  // or back: two, so that copies back never queue behind copies out.
  virtual c10::Stream side_stream(c10::Device device, bool to_host) = 0;
  // An event marking the work queued on `stream` so far.
  struct Event {
    virtual ~Event() = default;
  };
  virtual std::unique_ptr<Event> record(const c10::Stream& stream) = 0;
  // Work queued on `waiting` once this has returned starts only once the work
  // `event` marks is done.
  virtual void block(const Event& event, const c10::Stream& waiting) = 0;
  // Both: `waiting` waits for the work queued on `on` so far.
  void wait(const c10::Stream& waiting, const c10::Stream& on) { block(*record(on), waiting); }
  // Memory on `stream`'s device, from the allocator's pool of `stream`: the
  // stream that writes it first.
  virtual at::Tensor empty_on(const c10::Stream& stream, at::IntArrayRef sizes,
                              at::IntArrayRef strides, const at::TensorOptions& options) = 0;
  // Pinned host memory, so that copies to and from it can be asynchronous.
  virtual at::Tensor empty_pinned(at::IntArrayRef sizes, at::IntArrayRef strides,
                                  const at::TensorOptions& options) = 0;
  // `dst.copy_(src)`, queued on `stream` without waiting for it.
  virtual void copy(const at::Tensor& dst, const at::Tensor& src, const c10::Stream& stream) = 0;
  // `t`'s memory is used by the work queued on `stream` so far: the
  // allocator reuses it only once that work is done.
  virtual void record_stream(const at::Tensor& t, const c10::Stream& stream) = 0;
};

// The accelerators of this process, through c10's VirtualGuardImpl.
std::shared_ptr<DeviceOps> device_ops();

// host_memory() (sac/base/copy_target.h) through `ops`: tests check the order
// of its operations with a fake on the CPU.
std::shared_ptr<CopyTarget> host_memory(std::shared_ptr<DeviceOps> ops);

}  // namespace sac::detail
