// host_memory()'s stream order, on a machine without an accelerator: a fake
// DeviceOps (sac/base/internal/device_ops.h) whose "device" tensors are CPU tensors
// records each stream, event, allocation and copy, and the tests assert the
// order PyTorch's caching allocator needs (issue 22).
#include "support.h"

#include <sac/base/internal/device_ops.h>
#include <sac/offload/offload.h>

#include <ATen/EmptyTensor.h>

#include <algorithm>

namespace base_host_memory_test {

class FakeDevice final : public sac::detail::DeviceOps {
 public:
  bool on_device(const at::Tensor& t) const override { return t.is_cpu(); }
  c10::Stream current_stream(c10::Device) override { return stream(0); }
  c10::Stream side_stream(c10::Device, bool to_host) override { return stream(to_host ? 1 : 2); }
  struct Mark final : Event {
    explicit Mark(std::string stream) : stream(std::move(stream)) {}
    std::string stream;
  };
  std::unique_ptr<Event> record(const c10::Stream& stream) override {
    calls.push_back("mark " + name(stream));
    return std::make_unique<Mark>(name(stream));
  }
  void block(const Event& event, const c10::Stream& waiting) override {
    calls.push_back(name(waiting) + " waits for " + static_cast<const Mark&>(event).stream +
                    "'s mark");
  }
  at::Tensor empty_on(const c10::Stream& stream, at::IntArrayRef sizes, at::IntArrayRef strides,
                      const at::TensorOptions& options) override {
    calls.push_back("alloc on " + name(stream));
    device_bytes += bytes(sizes, strides, options);
    device_strides.push_back(strides.vec());
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
  std::vector<std::vector<int64_t>> device_strides;  // of each copy back

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

// Options whose policy offloads every mm output through host_memory(fake).
sac::CheckpointOptions offload_mm_to(const std::shared_ptr<FakeDevice>& fake) {
  return sac::CheckpointOptions()
      .policy(sac::Policy::answer_ops({"aten::mm"}, sac::CheckpointPolicy::MustCpuOffload))
      .offload_to(sac::detail::host_memory(fake));
}

TEST(DeviceOrder, ACopyOutWaitsForTheTensorsMakerAndHoldsItsMemoryUntilRead) {
  sac_test::expect_configured_mechanism();
  auto fake = std::make_shared<FakeDevice>();
  const auto target = sac::detail::host_memory(fake);
  const auto t = torch::randn({3, 4});
  const auto copy = target->copy_out(t);
  EXPECT_EQ(fake->calls, (Calls{"mark current", "to_host waits for current's mark", "alloc pinned",
                                "copy on to_host", "record on to_host"}));
  EXPECT_TRUE(torch::equal(copy, t));
}

// The copy back waits for the copies out before it (the host memory may
// still be written), its memory comes from the pool of the stream that
// writes it (a block the current stream freed may still be read by its
// queued kernels), on a stream of its own (never behind later copies out),
// and the current stream waits for it and is recorded as its user.
TEST(DeviceOrder, ACopyBackIsAllocatedOnItsOwnStreamAndHandedToTheCurrentOne) {
  sac_test::expect_configured_mechanism();
  auto fake = std::make_shared<FakeDevice>();
  const auto target = sac::detail::host_memory(fake);
  const auto copy = target->copy_out(torch::randn({3, 4}));
  fake->calls.clear();
  const auto back = target->copy_back(copy, sac::CopyTarget::Origin::of(copy));
  EXPECT_EQ(fake->calls, (Calls{"mark to_host", "to_device waits for to_host's mark",
                                "alloc on to_device", "copy on to_device", "mark to_device",
                                "current waits for to_device's mark", "record on current"}));
  EXPECT_TRUE(torch::equal(back, copy));
}

// A broadcast tensor (stride 0) and a view with gaps, saved by autograd under
// an OffloadGuard: the host holds their elements only (copy_ into a
// broadcast copy used to fail; the gapped view crossed with its span), they
// come back with their strides, and the gradients are the plain run's.
TEST(DeviceOrder, BroadcastAndGappedViewsCrossAsTheirElements) {
  sac_test::expect_configured_mechanism();
  auto x = torch::randn({4, 6}, torch::requires_grad());
  auto base = torch::randn({4, 1}, torch::requires_grad());
  auto wide = torch::randn({4, 9}, torch::requires_grad());
  auto f = [&] {
    auto e = (base * 1).expand({4, 6});   // stride 0 in dim 1
    auto g = (wide * 1).narrow(1, 0, 3);  // rows 9 apart, 3 used
    return (x * e).sum() + (g * g.sin()).sum();
  };
  const auto expected = torch::autograd::grad({f()}, {x, base, wide});
  auto fake = std::make_shared<FakeDevice>();
  at::Tensor y;
  {
    sac::OffloadGuard offload(sac::OffloadOptions().target(sac::detail::host_memory(fake)));
    y = f();
  }
  // Saved: x and e by the first mul (e: its 4 distinct elements), g by sin
  // and by the second mul (12 elements; back on the device, its span: 3
  // rows 9 apart, then 3), sin(g).
  const int64_t span = 3 * 9 + 3;
  EXPECT_EQ(fake->host_bytes, (4 * 6 + 4 * 1 + 12 + 12 + 4 * 3) * 4);
  sac_test::expect_bit_identical(expected, torch::autograd::grad({y}, {x, base, wide}));
  EXPECT_EQ(fake->device_bytes, (4 * 6 + 4 * 1 + span + span + 4 * 3) * 4);
}

// A policy's offload answers (the cache's copies): an output with permuted
// strides crosses dense and comes back with its strides, under both
// mechanisms (a non-view op's output has no gaps or broadcast dimensions).
TEST(DeviceOrder, APermutedOutputOffloadedByAPolicyComesBackWithItsStrides) {
  sac_test::expect_configured_mechanism();
  auto x = torch::randn({4, 9}, torch::requires_grad());
  auto f = [&](const at::Tensor& a) {
    const auto s = a.mul(3).t().sin();  // sin keeps its input's (transposed) strides
    return (s * s.cos()).sum();
  };
  const auto expected = torch::autograd::grad({f(x)}, {x});
  auto fake = std::make_shared<FakeDevice>();
  const auto options =
      sac::CheckpointOptions()
          .policy(sac::Policy::answer_ops({"aten::sin"}, sac::CheckpointPolicy::MustCpuOffload))
          .offload_to(sac::detail::host_memory(fake));
  auto y = sac::checkpoint(options, f, x);
  EXPECT_EQ(fake->host_bytes, 4 * 9 * 4);
  sac_test::expect_bit_identical(expected, torch::autograd::grad({y}, {x}));
  EXPECT_EQ(fake->device_bytes, fake->host_bytes);
  EXPECT_EQ(fake->device_strides, (std::vector<std::vector<int64_t>>{{1, 9}}));
}

// A recomputation starts every copy back before the current stream waits for
// any: the copies overlap the recomputation's first ops (before, each copy
// back made the current stream wait at once).
TEST(DeviceOrder, PrefetchedCopiesAreAllQueuedBeforeTheFirstWait) {
  sac_test::expect_configured_mechanism();
  auto x = torch::randn({8, 16}, torch::requires_grad());
  auto w = torch::randn({16, 16}, torch::requires_grad());
  auto f = [&](const at::Tensor& a) { return a.mm(w).tanh().mm(w).sin().mm(w).cos(); };
  const auto expected = torch::autograd::grad({f(x).sum()}, {x, w});
  auto fake = std::make_shared<FakeDevice>();
  auto y = sac::checkpoint(offload_mm_to(fake), f, x);
  fake->calls.clear();
  sac_test::expect_bit_identical(expected, torch::autograd::grad({y.sum()}, {x, w}));
  const auto first_wait =
      std::find(fake->calls.begin(), fake->calls.end(), "current waits for to_device's mark");
  ASSERT_NE(first_wait, fake->calls.end());
  EXPECT_EQ(std::count(fake->calls.begin(), first_wait, "copy on to_device"), 3);
  EXPECT_EQ(std::count(fake->calls.begin(), fake->calls.end(), "copy on to_device"), 3);
}

// A backward inside the forward recomputes the region so far, and takes
// its copies back without prefetching: before, it prefetched every copy, took
// a second one, and left the prefetched ones on the device until the final
// backward.
TEST(DeviceOrder, ARecomputationDuringTheForwardCopiesEachOutputBackOnce) {
  sac_test::expect_configured_mechanism();
  auto x = torch::randn({8, 16}, torch::requires_grad());
  auto w = torch::randn({16, 16}, torch::requires_grad());
  auto f = [&](const at::Tensor& a) {
    const auto h = a.mm(w).tanh();
    const auto g = torch::autograd::grad({h.sum()}, {a}, {}, true, /*create_graph=*/true)[0];
    return (g * a).sum();
  };
  const auto expected = torch::autograd::grad({f(x)}, {x, w});
  auto fake = std::make_shared<FakeDevice>();
  auto y = sac::checkpoint(offload_mm_to(fake), f, x);
  EXPECT_EQ(std::count(fake->calls.begin(), fake->calls.end(), "copy on to_device"), 1);
  sac_test::expect_bit_identical(expected, torch::autograd::grad({y}, {x, w}));
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
  auto y = sac::checkpoint(offload_mm_to(fake), f, x);
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

}  // namespace base_host_memory_test
