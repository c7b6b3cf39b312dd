// Memory, in exact bytes (a counting CPU allocator), not seconds.
#include "support.h"

#include <sac/cache/internal/op_cache.h>
#include <sac/cache/internal/selective_modes.h>

namespace checkpoint_memory_test {

using sac_test::CountingAllocator;

class Memory : public ::testing::Test {
 protected:
  void SetUp() override {
    sac_test::expect_configured_mechanism();
    CountingAllocator::install();
    torch::manual_seed(0);
    mlp = sac_test::Mlp(kIn, kHidden, kOut, /*depth=*/4);
    x = torch::randn({kBatch, kIn}, torch::requires_grad());
    // Warm up once: lazily created global state must not count below.
    auto y = sac::checkpoint(
        sac::CheckpointOptions().policy(sac::Policy::save_ops({"aten::addmm"})), forward(), x);
    torch::autograd::grad({y.sum()}, {x});
  }

  std::function<at::Tensor(const at::Tensor&)> forward() {
    return [this](const at::Tensor& in) { return mlp->forward(in); };
  }

  static constexpr int64_t kBatch = 8, kIn = 32, kHidden = 64, kOut = 16;
  static constexpr int64_t kFloat = 4;
  sac_test::Mlp mlp{nullptr};
  at::Tensor x;
};

// Only the region's output stays alive after the forward (its inputs were
// alive before); dropping the graph, or backward, frees everything.
TEST_F(Memory, FullRecomputeKeepsOnlyTheOutput) {
  const int64_t base = CountingAllocator::live_bytes();
  {
    auto y = sac::checkpoint(forward(), x);
    EXPECT_EQ(CountingAllocator::live_bytes() - base, kBatch * kOut * kFloat);
  }
  EXPECT_EQ(CountingAllocator::live_bytes(), base) << "dropping the graph freed everything";
  {
    auto y = sac::checkpoint(forward(), x);
    auto grads = torch::autograd::grad({y.sum()}, {x});
    EXPECT_EQ(grads[0].sizes(), x.sizes());
  }
  EXPECT_EQ(CountingAllocator::live_bytes(), base) << "backward freed everything";
}

// The un-checkpointed forward keeps every activation: a reference for the
// numbers above.
TEST_F(Memory, WithoutCheckpointActivationsStay) {
  const int64_t base = CountingAllocator::live_bytes();
  auto y = mlp->forward(x);
  // Autograd keeps the 3 relu outputs (relu's and the next addmm's saved
  // tensor); the addmm outputs die.
  EXPECT_EQ(CountingAllocator::live_bytes() - base,
            3 * kBatch * kHidden * kFloat + kBatch * kOut * kFloat);
}

// "Save matmuls" keeps exactly the addmm outputs (the last one is the
// region's output itself), nothing else; the cache knows how much it holds,
// and backward empties it.
TEST_F(Memory, SaveMatmulsKeepsExactlyTheMatmulOutputs) {
  const int64_t base = CountingAllocator::live_bytes();
  auto modes = sac::create_selective_checkpoint_contexts(sac::Policy::save_ops({"aten::addmm"}));
  auto options =
      sac::CheckpointOptions().context_fn([modes] { return sac::RegionContexts(modes); });
  {
    auto y = sac::checkpoint(options, forward(), x);
    const int64_t matmul_outputs = 3 * kBatch * kHidden * kFloat + kBatch * kOut * kFloat;
    EXPECT_EQ(static_cast<int64_t>(sac::detail::cache_of(modes)->bytes()), matmul_outputs);
    EXPECT_EQ(sac::detail::cache_of(modes)->kept_calls(), 4u);
    EXPECT_EQ(CountingAllocator::live_bytes() - base, matmul_outputs);
    auto grads = torch::autograd::grad({y.sum()}, {x});
    // Backward consumed the cache, and freed the graph: early stop never
    // needed the last addmm's output, which went with the graph.
    EXPECT_EQ(sac::detail::cache_of(modes)->bytes(), 0u);
    EXPECT_EQ(sac::detail::cache_of(modes)->kept_calls(), 0u);
  }
  EXPECT_EQ(CountingAllocator::live_bytes(), base);
}

TEST_F(Memory, DroppingASelectiveGraphWithoutBackwardFreesTheCache) {
  const int64_t base = CountingAllocator::live_bytes();
  std::weak_ptr<sac::detail::OpCache> cache;
  {
    auto modes = sac::create_selective_checkpoint_contexts(sac::Policy::save_ops({"aten::addmm"}));
    cache = sac::detail::cache_of(modes);
    auto options =
        sac::CheckpointOptions().context_fn([modes] { return sac::RegionContexts(modes); });
    auto y = sac::checkpoint(options, forward(), x);
    EXPECT_GT(CountingAllocator::live_bytes(), base);
  }
  EXPECT_TRUE(cache.expired()) << "the cache dies with the graph";
  EXPECT_EQ(CountingAllocator::live_bytes(), base);
}

// GPT block: after the forward, exactly the output and what the cache holds
// are alive; after backward, nothing.
TEST_F(Memory, GptBlockKeepsOutputAndCacheOnly) {
  sac_test::GptBlock block(32, 4, 0.1);
  auto input = torch::randn({2, 16, 32}, torch::requires_grad());
  auto run = [&](const at::Tensor& in) { return block->forward(in); };
  const int64_t base = CountingAllocator::live_bytes();
  auto modes = sac::create_selective_checkpoint_contexts(
      sac::Policy::save_ops({"aten::addmm", "aten::_scaled_dot_product_flash_attention_for_cpu"}));
  auto options =
      sac::CheckpointOptions().context_fn([modes] { return sac::RegionContexts(modes); });
  {
    auto y = sac::checkpoint(options, run, input);
    EXPECT_GT(sac::detail::cache_of(modes)->bytes(), 0u);
    EXPECT_EQ(CountingAllocator::live_bytes() - base,
              static_cast<int64_t>(y.storage().nbytes() + sac::detail::cache_of(modes)->bytes()));
    torch::autograd::grad({y.sum()}, {input});
    EXPECT_EQ(sac::detail::cache_of(modes)->bytes(), 0u);
  }
  EXPECT_EQ(CountingAllocator::live_bytes(), base);
}

}  // namespace checkpoint_memory_test
