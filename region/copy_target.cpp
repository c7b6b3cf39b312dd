#include <sac/region/copy_target.h>

#include <ATen/ops/empty_strided.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <mutex>
#include <unordered_map>

namespace sac {
namespace {

class HostMemory final : public CopyTarget {
 public:
  bool accepts(const at::Tensor& t) const override { return !t.is_cpu(); }

  at::Tensor copy_out(const at::Tensor& t) override {
    const c10::impl::VirtualGuardImpl device(t.device().type());
    const c10::Stream current = device.getStream(t.device());
    const c10::Stream side = side_stream(t.device());
    wait(side, current);  // t is made by work queued on the current stream
    at::Tensor host = at::empty_strided(t.sizes(), t.strides(),
                                        t.options().device(c10::kCPU).pinned_memory(true));
    {
      c10::StreamGuard on_side(side);
      host.copy_(t, /*non_blocking=*/true);
    }
    // The caller drops t now: its memory may be reused only after the copy.
    device.recordDataPtrOnStream(t.storage().data_ptr(), side);
    return host;
  }

  at::Tensor copy_back(const at::Tensor& copy, c10::Device to) override {
    const c10::impl::VirtualGuardImpl device(to.type());
    const c10::Stream current = device.getStream(to);
    const c10::Stream side = side_stream(to);
    // Allocated for the current stream, which uses it from now on.
    at::Tensor back = at::empty_strided(copy.sizes(), copy.strides(), copy.options().device(to));
    {
      c10::StreamGuard on_side(side);
      back.copy_(copy, /*non_blocking=*/true);
    }
    wait(current, side);
    return back;
  }

 private:
  // `waiting` runs the work queued after this call only once the work
  // queued on `on` so far is done.
  static void wait(const c10::Stream& waiting, const c10::Stream& on) {
    c10::Event done(on.device_type());
    done.record(on);
    done.block(waiting);
  }

  c10::Stream side_stream(c10::Device device) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = streams_.find(device);
    if (it == streams_.end()) {
      const c10::impl::VirtualGuardImpl impl(device.type());
      it = streams_.emplace(device, impl.getStreamFromGlobalPool(device)).first;
    }
    return it->second;
  }

  std::mutex mutex_;
  std::unordered_map<c10::Device, c10::Stream> streams_;
};

}  // namespace

std::shared_ptr<CopyTarget> host_memory() {
  static const std::shared_ptr<CopyTarget> memory = std::make_shared<HostMemory>();
  return memory;
}

}  // namespace sac
