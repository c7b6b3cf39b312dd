#include <sac/base/copy_target.h>

#include <sac/base/internal/device_ops.h>

#include <ATen/ops/empty_strided.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/strides.h>

#include <mutex>
#include <unordered_map>
#include <utility>

namespace sac {
namespace {

class VirtualDeviceOps final : public detail::DeviceOps {
 public:
  bool on_device(const at::Tensor& t) const override {
    // Device types whose guard has streams and a caching allocator that
    // records them; MPS and meta have neither, sparse tensors no strides.
    const c10::DeviceType type = t.device().type();
    return t.layout() == c10::kStrided &&
           (type == c10::DeviceType::CUDA || type == c10::DeviceType::HIP ||
            type == c10::DeviceType::XPU);
  }
  c10::Stream current_stream(c10::Device device) override {
    return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
  }
  c10::Stream side_stream(c10::Device device, bool to_host) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& streams = to_host ? to_host_ : to_device_;
    auto it = streams.find(device);
    if (it == streams.end()) {
      const c10::impl::VirtualGuardImpl impl(device.type());
      it = streams.emplace(device, impl.getStreamFromGlobalPool(device)).first;
    }
    return it->second;
  }
  struct RealEvent final : Event {
    explicit RealEvent(c10::DeviceType type) : event(type) {}
    c10::Event event;
  };
  std::unique_ptr<Event> record(const c10::Stream& stream) override {
    auto marker = std::make_unique<RealEvent>(stream.device_type());
    marker->event.record(stream);
    return marker;
  }
  void block(const Event& event, const c10::Stream& waiting) override {
    static_cast<const RealEvent&>(event).event.block(waiting);
  }
  at::Tensor empty_on(const c10::Stream& stream, at::IntArrayRef sizes, at::IntArrayRef strides,
                      const at::TensorOptions& options) override {
    c10::StreamGuard on(stream);  // the caching allocator takes the current stream's pool
    return at::empty_strided(sizes, strides, options.device(stream.device()));
  }
  at::Tensor empty_pinned(at::IntArrayRef sizes, at::IntArrayRef strides,
                          const at::TensorOptions& options) override {
    return at::empty_strided(sizes, strides, options.device(c10::kCPU).pinned_memory(true));
  }
  void copy(const at::Tensor& dst, const at::Tensor& src, const c10::Stream& stream) override {
    c10::StreamGuard on(stream);
    dst.copy_(src, /*non_blocking=*/true);
  }
  void record_stream(const at::Tensor& t, const c10::Stream& stream) override {
    c10::impl::VirtualGuardImpl(stream.device_type())
        .recordDataPtrOnStream(t.storage().data_ptr(), stream);
  }

 private:
  std::mutex mutex_;
  std::unordered_map<c10::Device, c10::Stream> to_host_, to_device_;
};

// A copy back on the side stream, handed to the current stream when taken.
class IncomingHostCopy final : public CopyTarget::Incoming {
 public:
  IncomingHostCopy(std::shared_ptr<detail::DeviceOps> ops, at::Tensor back,
                   std::unique_ptr<detail::DeviceOps::Event> copied, c10::IntArrayRef sizes)
      : ops_(std::move(ops)),
        back_(std::move(back)),
        copied_(std::move(copied)),
        sizes_(sizes.vec()) {}

  at::Tensor take() override {
    const c10::Stream current = ops_->current_stream(back_.device());
    ops_->block(*copied_, current);
    // From now on the current stream uses it: freed, it waits for that work.
    ops_->record_stream(back_, current);
    return back_.expand(sizes_);
  }

 private:
  std::shared_ptr<detail::DeviceOps> ops_;
  at::Tensor back_;
  std::unique_ptr<detail::DeviceOps::Event> copied_;
  std::vector<int64_t> sizes_;
};

// Pinned host memory, ordered as PyTorch's caching allocator requires.
class HostMemory final : public CopyTarget {
 public:
  explicit HostMemory(std::shared_ptr<detail::DeviceOps> ops) : ops_(std::move(ops)) {}

  bool accepts(const at::Tensor& t) const override { return ops_->on_device(t); }

  at::Tensor copy_out(const at::Tensor& t) override {
    const c10::Stream current = ops_->current_stream(t.device());
    const c10::Stream side = ops_->side_stream(t.device(), /*to_host=*/true);
    ops_->wait(side, current);  // t is made by work queued on the current stream
    const at::Tensor source = CopyTarget::without_broadcast(t);
    at::Tensor host =
        ops_->empty_pinned(source.sizes(), c10::contiguous_strides(source.sizes()), t.options());
    ops_->copy(host, source, side);
    // The caller drops t now: its memory may be reused only after the copy.
    ops_->record_stream(t, side);
    return host.expand(t.sizes());
  }

  at::Tensor copy_back(const at::Tensor& copy, const CopyTarget::Origin& from) override {
    return start_copy_back(copy, from)->take();
  }

  std::unique_ptr<CopyTarget::Incoming> start_copy_back(const at::Tensor& copy,
                                                        const CopyTarget::Origin& from) override {
    const c10::Stream side = ops_->side_stream(from.device, /*to_host=*/false);
    // The copy out may still be writing the host memory.
    ops_->wait(side, ops_->side_stream(from.device, /*to_host=*/true));
    const at::Tensor source = CopyTarget::without_broadcast(copy);  // pinned
    // From the side stream's pool: the side stream writes it first, so no
    // kernel still queued on the current stream can be using the block.
    at::Tensor back = ops_->empty_on(side, source.sizes(), from.strides, copy.options());
    ops_->copy(back, source, side);
    return std::make_unique<IncomingHostCopy>(ops_, std::move(back), ops_->record(side),
                                              copy.sizes());
  }

 private:
  std::shared_ptr<detail::DeviceOps> ops_;
};

// What a target that copies back at once starts.
class Arrived final : public CopyTarget::Incoming {
 public:
  explicit Arrived(at::Tensor t) : t_(std::move(t)) {}
  at::Tensor take() override { return std::move(t_); }

 private:
  at::Tensor t_;
};

}  // namespace

at::Tensor CopyTarget::without_broadcast(const at::Tensor& t) {
  at::Tensor out = t;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.stride(d) == 0 && t.size(d) > 1) {
      out = out.narrow(d, 0, 1);
    }
  }
  return out;
}

std::unique_ptr<CopyTarget::Incoming> CopyTarget::start_copy_back(const at::Tensor& copy,
                                                                  const CopyTarget::Origin& from) {
  return std::make_unique<Arrived>(copy_back(copy, from));
}

std::shared_ptr<detail::DeviceOps> detail::device_ops() {
  static const std::shared_ptr<detail::DeviceOps> ops = std::make_shared<VirtualDeviceOps>();
  return ops;
}

std::shared_ptr<CopyTarget> host_memory() {
  static const std::shared_ptr<CopyTarget> memory = host_memory(detail::device_ops());
  return memory;
}

std::shared_ptr<CopyTarget> detail::host_memory(std::shared_ptr<DeviceOps> ops) {
  return std::make_shared<HostMemory>(std::move(ops));
}

}  // namespace sac
