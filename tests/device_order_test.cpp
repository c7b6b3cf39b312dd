// host_memory()'s stream order, on a machine without an accelerator: a fake
// DeviceOps (sac/region/device_ops.h) whose "device" tensors are CPU tensors
// records each stream, event, allocation and copy, and the tests assert the
// order PyTorch's caching allocator needs (issue 22).
#include "support.h"

#include <sac/offload/offload.h>
#include <sac/region/device_ops.h>

#include <ATen/EmptyTensor.h>

namespace {

class FakeDevice final : public sac::DeviceOps {
 public:
  bool on_device(const at::Tensor& t) const override { return t.is_cpu(); }
  c10::Stream current_stream(c10::Device) override { return stream(0); }
  c10::Stream side_stream(c10::Device, bool to_host) override { return stream(to_host ? 1 : 2); }
  void wait(const c10::Stream& waiting, const c10::Stream& on) override {
    calls.push_back("wait " + name(waiting) + " on " + name(on));
  }
  at::Tensor empty_on(const c10::Stream& stream, at::IntArrayRef sizes, at::IntArrayRef strides,
                      const at::TensorOptions& options) override {
    calls.push_back("alloc on " + name(stream));
    device_bytes += bytes(sizes, strides, options);
    return at::empty_strided(sizes, strides, options);
  }
  at::Tensor empty_pinned(at::IntArrayRef sizes, at::IntArrayRef strides,
                          const at::TensorOptions& options) override {
    calls.push_back("alloc pinned");
    host_bytes += bytes(sizes, strides, options);
    return at::empty_strided(sizes, strides, options.device(c10::kCPU));
  }
  void copy(const at::Tensor& dst, const at::Tensor& src, const c10::Stream& stream) override {
    calls.push_back("copy on " + name(stream));
    dst.copy_(src);
  }
  void record_stream(const at::Tensor&, const c10::Stream& stream) override {
    calls.push_back("record on " + name(stream));
  }

  std::vector<std::string> calls;
  int64_t host_bytes = 0, device_bytes = 0;

 private:
  static c10::Stream stream(c10::StreamId id) {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::kCPU), id);
  }
  static std::string name(const c10::Stream& s) {
    return s.id() == 0 ? "current" : s.id() == 1 ? "to_host" : "to_device";
  }
  static int64_t bytes(at::IntArrayRef sizes, at::IntArrayRef strides,
                       const at::TensorOptions& options) {
    return static_cast<int64_t>(
        at::detail::computeStorageNbytes(sizes, strides, options.dtype().itemsize()));
  }
};

using Calls = std::vector<std::string>;

TEST(DeviceOrder, ACopyOutWaitsForTheTensorsMakerAndHoldsItsMemoryUntilRead) {
  sac_test::expect_configured_mechanism();
  auto fake = std::make_shared<FakeDevice>();
  const auto target = sac::host_memory(fake);
  const auto t = torch::randn({3, 4});
  const auto copy = target->copy_out(t);
  EXPECT_EQ(fake->calls, (Calls{"wait to_host on current", "alloc pinned", "copy on to_host",
                                "record on to_host"}));
  EXPECT_TRUE(torch::equal(copy, t));
}

// The copy back's memory comes from the pool of the stream that writes it
// (a block the current stream freed may still be read by its queued
// kernels), on a stream of its own (never behind copies out), and the
// current stream waits for it and is recorded as its user.
TEST(DeviceOrder, ACopyBackIsAllocatedOnItsOwnStreamAndHandedToTheCurrentOne) {
  sac_test::expect_configured_mechanism();
  auto fake = std::make_shared<FakeDevice>();
  const auto target = sac::host_memory(fake);
  const auto copy = target->copy_out(torch::randn({3, 4}));
  fake->calls.clear();
  const auto back = target->copy_back(copy, c10::Device(c10::kCPU));
  EXPECT_EQ(fake->calls, (Calls{"alloc on to_device", "copy on to_device",
                                "wait current on to_device", "record on current"}));
  EXPECT_TRUE(torch::equal(back, copy));
}

// A broadcast tensor (stride 0) and a view with gaps, saved by autograd under
// an OffloadGuard: the broadcast one crosses as its elements (copy_ into a
// broadcast copy used to fail), the gapped one with its span, both keep
// their strides, and the gradients are the plain run's.
TEST(DeviceOrder, BroadcastAndGappedViewsCrossWithTheirStrides) {
  sac_test::expect_configured_mechanism();
  auto x = torch::randn({4, 6}, torch::requires_grad());
  auto base = torch::randn({4, 1}, torch::requires_grad());
  auto wide = torch::randn({4, 9}, torch::requires_grad());
  auto f = [&] {
    auto e = (base * 1).expand({4, 6});  // stride 0 in dim 1
    auto g = (wide * 1).narrow(1, 0, 3);  // rows 9 apart, 3 used
    return (x * e).sum() + (g * g.sin()).sum();
  };
  const auto expected = torch::autograd::grad({f()}, {x, base, wide});
  auto fake = std::make_shared<FakeDevice>();
  at::Tensor y;
  {
    sac::OffloadGuard offload(sac::OffloadOptions().target(sac::host_memory(fake)));
    y = f();
  }
  // Saved: x and e by the first mul (e: its 4 distinct elements), g by sin
  // and by the second mul (its span: 3 rows 9 apart, then 3), sin(g).
  const int64_t span = 3 * 9 + 3;
  const int64_t floats = 4 * 6 + 4 * 1 + span + span + 4 * 3;
  EXPECT_EQ(fake->host_bytes, floats * 4);
  sac_test::expect_bit_identical(expected, torch::autograd::grad({y}, {x, base, wide}));
  EXPECT_EQ(fake->device_bytes, floats * 4);
}

// Offload answers go through the same target; they come back before the
// recomputation's first op.
TEST(DeviceOrder, OffloadAnswersCrossAndComeBackBitIdentical) {
  sac_test::expect_configured_mechanism();
  auto x = torch::randn({8, 16}, torch::requires_grad());
  auto w = torch::randn({16, 16}, torch::requires_grad());
  auto f = [&](const at::Tensor& a) { return a.mm(w).tanh().t().mm(a).sin(); };
  const auto expected = torch::autograd::grad({f(x).sum()}, {x, w});
  auto fake = std::make_shared<FakeDevice>();
  const auto options =
      sac::CheckpointOptions()
          .policy(sac::Policy::answer_ops({"aten::mm"}, sac::CheckpointPolicy::MustCpuOffload))
          .offload_to(sac::host_memory(fake));
  auto y = sac::checkpoint(options, f, x);
  EXPECT_EQ(fake->host_bytes, (8 * 16 + 16 * 16) * 4) << "the two mm outputs";
  sac_test::expect_bit_identical(expected, torch::autograd::grad({y.sum()}, {x, w}));
  EXPECT_EQ(fake->device_bytes, fake->host_bytes);
}

TEST(DeviceOrder, TheRealTargetTakesAcceleratorTensorsOnly) {
  sac_test::expect_configured_mechanism();
  const auto target = sac::host_memory();
  EXPECT_FALSE(target->accepts(torch::randn({2})));
  EXPECT_FALSE(target->accepts(torch::randn({2}, torch::device(torch::kMeta))));
  EXPECT_FALSE(target->accepts(torch::randn({2, 2}).to_sparse()));
}

}  // namespace
