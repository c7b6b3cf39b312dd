// sac::CheckpointRegion on programs that once gave silently wrong gradients
// (issue 21): constants made from host data inside the region, outside
// tensors that share memory kept through an OffloadGuard's copy target, the
// outside-tensor check inside an OffloadGuard. Each test also runs under
// per-op kernels, where the guard's clear error is the expected outcome.
#include "support.h"

#include <sac/dispatch/internal/interceptor.h>
#include <sac/offload/offload.h>

#include "examples/host_arena.h"

namespace checkpoint_region_exact_test {

using sac_examples::HostArena;
using sac_test::error_of;
using sac_test::expect_bit_identical;

// Under per-op kernels the guard refuses to start, saying what to use.
bool region_available() {
  sac_test::expect_configured_mechanism();
  if (sac::detail::observers_see_every_op()) {
    return true;
  }
  const auto message = error_of([] { sac::CheckpointRegion region; });
  EXPECT_NE(message.find("fallback-key dispatch mechanism"), std::string::npos) << message;
  return false;
}

// d(sum(f()))/d(inputs), computed plainly and with f inside a region (under
// an OffloadGuard with `target` if given).
struct Gradients {
  std::vector<at::Tensor> plain, region;
};
Gradients both_ways(const std::function<at::Tensor()>& f, const std::vector<at::Tensor>& inputs,
                    const std::shared_ptr<sac::CopyTarget>& target = nullptr) {
  Gradients g;
  g.plain = torch::autograd::grad({f().sum()}, inputs);
  at::Tensor y;
  {
    std::optional<sac::OffloadGuard> offload;
    if (target != nullptr) offload.emplace(sac::OffloadOptions().target(target));
    sac::CheckpointRegion region;
    y = f();
  }
  g.region = torch::autograd::grad({y.sum()}, inputs);
  return g;
}

TEST(RegionExact, AConstantFromHostDataIsReplayedWithItsValues) {
  if (!region_available()) return;
  auto x = torch::randn({4}, torch::requires_grad());
  const auto g = both_ways([&] { return x * torch::tensor(std::vector<float>{2, 3, 4, 5}); }, {x});
  expect_bit_identical(g.plain, g.region);
  EXPECT_TRUE(torch::equal(g.region[0], torch::tensor(std::vector<float>{2, 3, 4, 5})));
}

TEST(RegionExact, AnIndexFromHostDataIsReplayedWithItsValues) {
  if (!region_available()) return;
  auto m = torch::randn({3, 4}, torch::requires_grad());
  const auto g = both_ways(
      [&] {
        return torch::index_select(m.pow(2), 1, torch::tensor(std::vector<int64_t>{2, 2}));
      },
      {m});
  expect_bit_identical(g.plain, g.region);
}

TEST(RegionExact, ConstantsFromInitializerListsScalarsAndBlobsAreReplayedWithTheirValues) {
  if (!region_available()) return;
  auto x = torch::randn({2, 3}, torch::requires_grad());
  std::vector<double> host{0.5, -1.5, 2.5};
  const auto g = both_ways(
      [&] {
        auto a = torch::tensor({{1.0f, 2.0f, 3.0f}, {4.0f, 5.0f, 6.0f}});
        auto s = torch::tensor(3.5f);
        // from_blob over host memory that is changed after the region.
        auto b = torch::from_blob(host.data(), {3}, torch::kFloat64).to(torch::kFloat32);
        auto c = torch::from_blob(host.data(), {3}, torch::kFloat64);
        return (x * a + s) * b + x.to(torch::kFloat64).mul(c).to(torch::kFloat32);
      },
      {x});
  expect_bit_identical(g.plain, g.region);
}

TEST(RegionExact, HostDataChangedAfterTheRegionIsReplayedAsTheRegionSawIt) {
  if (!region_available()) return;
  auto x = torch::randn({3}, torch::requires_grad());
  std::vector<float> host{1, 2, 3};
  auto c = torch::from_blob(host.data(), {3});
  const auto expected = torch::autograd::grad({(x * c).sin().sum()}, {x});
  at::Tensor y;
  {
    sac::CheckpointRegion region;
    y = (x * c).sin();
  }
  host = {7, 8, 9};
  expect_bit_identical(expected, torch::autograd::grad({y.sum()}, {x}));
}

// Host code writes a constant again between two reads, ops write constants
// that host code filled, and host code fills what an op left: every read
// sees the bytes it saw in the forward.
TEST(RegionExact, HostAndOpWritesToTheSameMemoryAreReplayedInOrder) {
  if (!region_available()) return;
  auto x = torch::randn({4}, torch::requires_grad());
  const auto g = both_ways(
      [&] {
        auto c = torch::tensor(std::vector<float>{2, 3, 4, 5});
        auto y = x + c;  // reads c; autograd saves nothing of it
        c.data_ptr<float>()[0] = -7;
        auto z = x * c;  // saves c as it is now
        auto w = torch::tensor(std::vector<float>{1, 2, 1, 2}).mul_(z.detach());
        auto e = torch::empty({4});
        e.narrow(0, 0, 2).fill_(0.5);
        e.data_ptr<float>()[2] = 8;
        e.data_ptr<float>()[3] = 9;
        return y + z * w + x * e;
      },
      {x});
  expect_bit_identical(g.plain, g.region);
}

TEST(RegionExact, OutsideViewsKeptByAnOffloadTargetStayViewsOfOneCopy) {
  if (!region_available()) return;
  auto w = torch::randn({4, 3}, torch::requires_grad());
  auto x = w * 1.5;            // made before the region
  auto v = x.narrow(1, 2, 1);  // a view of it, before the region too
  // The view is read first: the whole tensor is then an alias of its memory.
  const auto g =
      both_ways([&] { return (v.exp() * x.sin()).tanh(); }, {w}, std::make_shared<HostArena>());
  expect_bit_identical(g.plain, g.region);
}

TEST(RegionExact, OverlappingOutsideNarrowsKeptByAnOffloadTargetAreExact) {
  if (!region_available()) return;
  auto a = torch::randn({12}, torch::requires_grad());
  auto b = a * 2;
  auto p = b.narrow(0, 1, 10), q = b.narrow(0, 2, 4);
  auto e = b.narrow(0, 0, 1).expand({4});  // stride 0
  const auto g =
      both_ways([&] { return p.sin().sum() * q.cos() * e; }, {a}, std::make_shared<HostArena>());
  expect_bit_identical(g.plain, g.region);
}

TEST(RegionExact, OutsideTensorModifiedBeforeBackwardIsAnErrorInsideAnOffloadGuard) {
  if (!region_available()) return;
  for (const bool takes : {false, true}) {
    SCOPED_TRACE(takes ? "a target that takes the tensor" : "a target that takes nothing");
    auto leaf = torch::randn({5, 3}, torch::requires_grad());
    auto idx = torch::tensor(std::vector<int64_t>{0, 2, 4});
    auto t = torch::index_select(leaf, 0, idx);
    std::shared_ptr<sac::CopyTarget> target = std::make_shared<HostArena>();
    at::Tensor y;
    {
      sac::OffloadGuard offload(
          sac::OffloadOptions().target(target).min_bytes(takes ? 0 : 1 << 30));
      sac::CheckpointRegion region;
      y = torch::tanh(torch::sigmoid(t));
    }
    {
      torch::NoGradGuard no_grad;
      t.add_(-0.5);
    }
    const auto message = error_of([&] { y.sum().backward(); });
    EXPECT_NE(message.find("a tensor the region read but did not make"), std::string::npos)
        << message;
  }
}

}  // namespace checkpoint_region_exact_test
