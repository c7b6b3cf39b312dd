// Per-region statistics (sac/cache/statistics.h) against what really
// happened: bytes on the counting allocator, calls in the profile and in
// explain, passes and served calls in backward.
#include "support.h"

#include <sac/dispatch/internal/interceptor.h>
#include <sac/lab/budget.h>
#include <sac/lab/explain.h>
#include <sac/lab/profile.h>

#include <sstream>

namespace cache_statistics_test {

using sac_test::CountingAllocator;
using sac_test::error_of;
using sac_test::expect_bit_identical;
using sac_test::GptBlock;
using sac_test::run_and_grad;

class Statistics : public ::testing::Test {
 protected:
  void SetUp() override {
    sac_test::expect_configured_mechanism();
    CountingAllocator::install();
    at::set_num_threads(1);
    torch::manual_seed(0);
    block = GptBlock(64, 4, 0.1);
    x = torch::randn({2, 16, 64}, torch::requires_grad());
  }

  // Checkpoints the block under `options`; returns the bytes kept after the
  // forward beyond the output (dropped, its sum kept), then runs backward.
  int64_t run(const sac::CheckpointOptions& options) {
    torch::manual_seed(7);
    const int64_t base = CountingAllocator::live_bytes();
    at::Tensor y = sac::checkpoint(
        options, [&](const at::Tensor& in) { return block->forward(in); }, x);
    const at::Tensor loss = y.sum();
    y = at::Tensor();
    const int64_t kept =
        CountingAllocator::live_bytes() - base - static_cast<int64_t>(loss.nbytes());
    after_forward =
        options.statistics() ? options.statistics()->read() : sac::RegionStatistics::Counts();
    loss.backward();
    return kept;
  }

  GptBlock block{nullptr};
  at::Tensor x;
  sac::RegionStatistics::Counts after_forward;
};

// After the forward: the bytes kept are the allocator's, kept + dropped are
// the profile's bytes of the calls the policy decides about, and the calls
// split as explain reports them. After backward: one pass that served every
// saved call and reran every recomputed one (no early stop).
TEST_F(Statistics, EqualCountedBytesAndExplainedCalls) {
  torch::manual_seed(7);
  const sac::RegionProfile profile = sac::profile([&] { block->forward(x); }, 1);
  const int64_t none = run(sac::CheckpointOptions().policy(sac::nothing_saveable()));
  for (const auto& policy : {sac::everything_saveable(), sac::nothing_saveable(),
                             sac::compute_intensive_ops(), sac::dots_saveable(),
                             sac::budgeted_policy(profile, sac::Budget::of_everything_saveable(0.4),
                                                  std::nullopt, false)}) {
    SCOPED_TRACE(policy.describe());
    // The calls the policy decides about, as profiled.
    int64_t decided_bytes = 0;
    size_t decided_calls = 0;
    for (const auto& c : profile.calls()) {
      if (c.cacheable && policy.decides_about(c.op)) {
        decided_bytes += c.output_bytes;
        ++decided_calls;
      }
    }
    auto stats = std::make_shared<sac::RegionStatistics>();
    const int64_t kept =
        run(sac::CheckpointOptions().policy(policy).statistics(stats).early_stop(false));
    const sac::RegionStatistics::Counts& f = after_forward;
    EXPECT_EQ(f.forwards, 1u);
    EXPECT_EQ(f.recomputations, 0u) << "no recomputation before backward";
    EXPECT_EQ(f.bytes_saved, kept - none);
    EXPECT_EQ(f.bytes_saved + f.bytes_dropped, decided_bytes);
    EXPECT_EQ(f.bytes_offloaded, 0);
    EXPECT_EQ(f.calls_seen, decided_calls);
    EXPECT_EQ(f.calls_saved + f.calls_offloaded + f.calls_recomputed, f.calls_seen);
    if (policy.describe() == "nothing_saveable") {
      // It asks about no op: nothing is counted, nothing dropped.
      EXPECT_EQ(f.calls_seen, 0u);
      EXPECT_EQ(f.bytes_dropped, 0);
    }

    torch::manual_seed(7);
    const sac::Explanation e = sac::explain(policy, [&] { block->forward(x); });
    size_t saved = 0, recomputed = 0, demoted = 0;
    for (const auto& call : e.calls()) {
      saved += call.outcome == sac::ExplainedCall::Outcome::Saved ? 1 : 0;
      // Statistics count a demoted call among the recomputed ones.
      recomputed += call.outcome == sac::ExplainedCall::Outcome::Recomputed ||
                            call.outcome == sac::ExplainedCall::Outcome::Demoted
                        ? 1
                        : 0;
      demoted += call.outcome == sac::ExplainedCall::Outcome::Demoted ? 1 : 0;
    }
    EXPECT_EQ(f.calls_saved, saved);
    EXPECT_EQ(f.calls_recomputed, recomputed);
    EXPECT_EQ(f.calls_demoted, demoted);
    EXPECT_EQ(f.bytes_saved, e.saved_bytes());

    const sac::RegionStatistics::Counts b = stats->read();
    EXPECT_EQ(b.recomputations, 1u);
    EXPECT_EQ(b.calls_served, f.calls_saved);
    EXPECT_EQ(b.calls_rerun, f.calls_recomputed);
    EXPECT_GT(b.recompute_seconds, 0);
  }
  // nn::Linear on 3-D input modifies mm's output in place: saving every
  // call demotes each such call.
  size_t modified_later = 0;
  for (const auto& c : profile.calls()) {
    modified_later += c.cacheable && c.modified_later ? 1 : 0;
  }
  ASSERT_GT(modified_later, 0u);
  auto everything = std::make_shared<sac::RegionStatistics>();
  run(sac::CheckpointOptions().policy(sac::everything_saveable()).statistics(everything));
  EXPECT_EQ(after_forward.calls_demoted, modified_later);
}

// Offloaded calls and bytes: the bytes leave the device (the allocator's
// count) and come back served.
TEST_F(Statistics, CountOffloadedCallsAndBytes) {
  class Copies final : public sac::CopyTarget {
   public:
    bool accepts(const at::Tensor&) const override { return true; }
    at::Tensor copy_out(const at::Tensor& t) override {
      // Outside the counting allocator's view: a copy the test holds apart.
      copies.push_back(t.clone());
      bytes += static_cast<int64_t>(t.storage().nbytes());
      return copies.back();
    }
    at::Tensor copy_back(const at::Tensor& c, const sac::CopyTarget::Origin&) override {
      return c.clone();
    }
    std::vector<at::Tensor> copies;
    int64_t bytes = 0;
  };
  const auto expected =
      run_and_grad([&] { return block->forward(x); }, {x}, block->parameters(), 7);
  auto copies = std::make_shared<Copies>();
  auto stats = std::make_shared<sac::RegionStatistics>();
  const auto options = sac::CheckpointOptions()
                           .policy(sac::offload_if(sac::dots_saveable(), int64_t{0}))
                           .offload_to(copies)
                           .statistics(stats)
                           .early_stop(false);
  const auto actual = run_and_grad(
      [&] {
        return sac::checkpoint(
            options, [&](const at::Tensor& in) { return block->forward(in); }, x);
      },
      {x}, block->parameters(), 7);
  expect_bit_identical(expected, actual);
  const sac::RegionStatistics::Counts c = stats->read();
  EXPECT_GT(c.calls_offloaded, 0u);
  EXPECT_EQ(c.calls_saved, 0u);
  EXPECT_EQ(c.bytes_saved, 0);
  EXPECT_EQ(c.bytes_offloaded, copies->bytes);
  EXPECT_EQ(c.calls_served, c.calls_offloaded);
}

// One object shared by regions sums them; reset() starts again. Tags and
// the answers they change are counted.
TEST_F(Statistics, SumOverRegionsAndCountTags) {
  auto stats = std::make_shared<sac::RegionStatistics>();
  const auto options =
      sac::CheckpointOptions()
          .policy(sac::any_of({sac::dots_saveable(), sac::save_only_these_names({"attn"})}))
          .statistics(stats)
          .early_stop(false);
  auto twice = [&] {
    at::Tensor h = x;
    for (int i = 0; i < 2; ++i) {
      h = sac::checkpoint(
          options, [&](const at::Tensor& in) { return sac::tag(block->forward(in), "attn"); }, h);
    }
    return h;
  };
  twice().sum().backward();
  const sac::RegionStatistics::Counts two = stats->read();
  EXPECT_EQ(two.forwards, 2u);
  EXPECT_EQ(two.tags, 2u);
  EXPECT_EQ(two.recomputations, 2u);
  // Tags are not calls: they split into nothing and are never rerun.
  EXPECT_EQ(two.calls_saved + two.calls_offloaded + two.calls_recomputed, two.calls_seen);
  EXPECT_EQ(two.calls_rerun, two.calls_recomputed);
  EXPECT_EQ(two.calls_served, two.calls_saved);
  stats->reset();
  EXPECT_EQ(stats->read().forwards, 0u);
  {
    auto one = std::make_shared<sac::RegionStatistics>();
    sac::checkpoint(
        sac::CheckpointOptions().policy(sac::dots_saveable()).statistics(one),
        [&](const at::Tensor& in) { return block->forward(in); }, x);
    const sac::RegionStatistics::Counts c = one->read();
    // The tag kept the block's output (its producer's call) in each region.
    EXPECT_EQ(two.calls_saved, 2 * c.calls_saved + 2);
    EXPECT_EQ(two.bytes_saved, 2 * c.bytes_saved + 2 * static_cast<int64_t>(x.nbytes()));
  }
  std::ostringstream printed;
  two.print(printed);
  EXPECT_NE(printed.str().find("2 tags"), std::string::npos) << printed.str();
}

// Statistics count a policy's modes: without a policy they are refused.
TEST_F(Statistics, WithoutAPolicyAreAnError) {
  const auto options =
      sac::CheckpointOptions().statistics(std::make_shared<sac::RegionStatistics>());
  const std::string message = error_of([&] {
    sac::checkpoint(
        options, [&](const at::Tensor& in) { return block->forward(in); }, x);
  });
  EXPECT_NE(message.find("statistics"), std::string::npos) << message;
  EXPECT_NE(message.find("nothing_saveable"), std::string::npos) << message;
}

// A CheckpointRegion guard with a policy counts the same as sac::checkpoint.
TEST_F(Statistics, CountTheRegionGuard) {
  if (!sac::detail::observers_see_every_op()) {
    GTEST_SKIP() << "CheckpointRegion needs the fallback-key mechanism";
  }
  auto by_call = std::make_shared<sac::RegionStatistics>();
  run(sac::CheckpointOptions().policy(sac::dots_saveable()).statistics(by_call));
  auto by_guard = std::make_shared<sac::RegionStatistics>();
  {
    at::Tensor y;
    {
      sac::CheckpointRegion region(
          sac::CheckpointOptions().policy(sac::dots_saveable()).statistics(by_guard));
      y = block->forward(x);
    }
    y.sum().backward();
  }
  const sac::RegionStatistics::Counts a = by_call->read(), b = by_guard->read();
  EXPECT_EQ(b.forwards, 1u);
  EXPECT_EQ(b.calls_seen, a.calls_seen);
  EXPECT_EQ(b.calls_saved, a.calls_saved);
  EXPECT_EQ(b.bytes_saved, a.bytes_saved);
  EXPECT_EQ(b.bytes_dropped, a.bytes_dropped);
  EXPECT_EQ(b.recomputations, 1u);
  EXPECT_GT(b.calls_served, 0u);
}

}  // namespace cache_statistics_test
