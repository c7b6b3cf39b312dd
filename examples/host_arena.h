// A copy target for sac::OffloadGuard on a CPU-only machine: memory of its
// own, outside the counting allocator (examples/support.h), so the bytes that
// leave the "device" and those held in the target are both exact. It stands
// in for host memory where the device is the CPU already.
#pragma once

#include <sac/offload/offload.h>

#include <ATen/EmptyTensor.h>
#include <ATen/Functions.h>

#include <cstdlib>
#include <memory>

namespace sac_examples {

class HostArena final : public sac::CopyTarget {
 public:
  bool accepts(const at::Tensor&) const override { return true; }
  // Dense copies of the elements, a broadcast dimension copied once, as
  // host_memory() makes them (sac/base/copy_target.h).
  at::Tensor copy_out(const at::Tensor& t) override {
    const at::Tensor source = sac::CopyTarget::without_broadcast(t);
    const auto bytes = static_cast<int64_t>(source.numel() * t.itemsize());
    void* memory = std::malloc(static_cast<size_t>(bytes) + 1);
    *held_ += bytes;
    ++copies_;
    auto held = held_;
    at::Tensor copy = at::from_blob(
        memory, source.sizes(),
        [held, bytes](void* p) {
          *held -= bytes;
          std::free(p);
        },
        t.options());
    copy.copy_(source);
    return copy.expand(t.sizes());
  }
  at::Tensor copy_back(const at::Tensor& copy, const sac::CopyTarget::Origin& from) override {
    ++returns_;
    const at::Tensor source = sac::CopyTarget::without_broadcast(copy);
    at::Tensor back =
        at::empty_strided(source.sizes(), from.strides, copy.options().device(from.device));
    back.copy_(source);
    return back.expand(copy.sizes());
  }
  int64_t held() const { return *held_; }
  int64_t copies() const { return copies_; }
  int64_t returns() const { return returns_; }

 private:
  std::shared_ptr<int64_t> held_ = std::make_shared<int64_t>(0);
  int64_t copies_ = 0;
  int64_t returns_ = 0;
};

}  // namespace sac_examples
