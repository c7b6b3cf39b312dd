// Checkpointed regions that communicate, on two ranks: c10d with Gloo over
// loopback. ctest starts both ranks with examples/launch_ranks.sh, which
// kills them and fails the test if either fails or they outlive its timeout.
//
// The model: layers whose weight is sharded over the ranks and all-gathered
// inside each checkpointed region (the FSDP pattern), and whose hidden values
// are summed over the ranks there too (an all-reduce). Collectives of the
// regions (forward and recomputation) go through group "fwd", those of
// backward through "bwd", so that "fwd"'s backend counts exactly what the
// regions issued.
#include "examples/c10d_support.h"
#include "support.h"

#include <sac/sac.h>
#include <sac/policy/presets.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace {

namespace dist = sac_examples::dist;
using sac_test::error_of;
using sac_test::expect_bit_identical;

constexpr int64_t kWidth = 16;  // divisible by the world size
constexpr int64_t kRows = 4;    // rows of input per rank
constexpr int64_t kLayers = 2;
constexpr auto kTimeout = std::chrono::seconds(60);

struct World {
  dist::Rendezvous rendezvous;
  std::optional<dist::Group> fwd, bwd;
};
World* world = nullptr;

const dist::Group& fwd() { return *world->fwd; }
const dist::Group& bwd() { return *world->bwd; }
int rank() { return world->rendezvous.rank; }
int ranks() { return world->rendezvous.world; }

// Every rank makes the same full weights and every rank's inputs, from seeds:
// a rank keeps its own shard and its own input; the single-process reference
// uses them all.
std::vector<at::Tensor> full_weights() {
  torch::manual_seed(7);
  std::vector<at::Tensor> w;
  for (int64_t l = 0; l < kLayers; ++l) {
    w.push_back(torch::randn({kWidth, kWidth}) / 4);
  }
  return w;
}
at::Tensor input_of(int r) {
  torch::manual_seed(100 + r);
  return torch::randn({kRows, kWidth});
}
at::Tensor shard_of(const at::Tensor& full, int r) {
  return full.reshape({-1}).chunk(ranks())[r].clone();
}

// One layer's math, given its full weight `w` and a function that sums a
// tensor over the ranks.
template <typename SumOverRanks>
at::Tensor layer(const at::Tensor& x, const at::Tensor& w, SumOverRanks sum_over_ranks) {
  const at::Tensor h = torch::mm(x, w).relu();
  return torch::tanh(sum_over_ranks(h)) * h;
}

at::Tensor sharded_layer(const at::Tensor& x, const at::Tensor& shard) {
  const at::Tensor w = dist::AllGather::apply(shard, &fwd(), &bwd()).view({kWidth, kWidth});
  return layer(x, w,
               [](const at::Tensor& h) { return dist::SumOverRanks::apply(h, &fwd(), &bwd()); });
}

// How each layer runs: plainly, under sac::checkpoint with `options`.
using Runner = std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>;

Runner plain() { return sharded_layer; }
Runner checkpointed(sac::CheckpointOptions options) {
  return [options](const at::Tensor& x, const at::Tensor& shard) {
    return sac::checkpoint(options, sharded_layer, x, shard);
  };
}
// A sac::CheckpointRegion around each layer, its gather included.
Runner in_a_region(sac::CheckpointOptions options) {
  return [options](const at::Tensor& x, const at::Tensor& shard) {
    sac::CheckpointRegion region(options);
    return sharded_layer(x, shard);
  };
}

bool regions_available() {
  return sac::dispatch::mechanism() == sac::dispatch::Mechanism::FallbackKey;
}

struct Step {
  std::vector<at::Tensor> shard_grads;
  int64_t forward_collectives;   // issued through "fwd" during the forward
  int64_t backward_collectives;  // issued through "fwd" during backward
};

Step sharded_step(const Runner& run) {
  const auto weights = full_weights();
  std::vector<at::Tensor> shards;
  for (const auto& w : weights) {
    shards.push_back(shard_of(w, rank()).requires_grad_());
  }
  at::Tensor h = input_of(rank());
  const int64_t before = fwd().issued();
  for (const auto& shard : shards) {
    h = run(h, shard);
  }
  const int64_t after_forward = fwd().issued();
  h.sum().backward();
  Step step{{}, after_forward - before, fwd().issued() - after_forward};
  for (const auto& shard : shards) {
    step.shard_grads.push_back(shard.grad());
  }
  return step;
}

// ---- Collectives are counted, and kept ones are never issued again ----------

struct PolicyCase {
  std::string name;
  std::function<sac::Policy()> policy;
  bool reissues;  // whether the policy recomputes the region's collectives
};

class Policies : public ::testing::TestWithParam<PolicyCase> {};

TEST_P(Policies, IssueWhatThePolicyRecomputesAndMatchTheUncheckpointedGradients) {
  const Step reference = sharded_step(plain());
  EXPECT_EQ(reference.forward_collectives, 2 * kLayers);
  EXPECT_EQ(reference.backward_collectives, 0);

  auto stats = std::make_shared<sac::RegionStatistics>();
  const Step step = sharded_step(
      checkpointed(sac::CheckpointOptions().policy(GetParam().policy()).statistics(stats)));
  const sac::RegionStatistics::Counts counts = stats->read();
  // Counted by the process group, and by sac.
  EXPECT_EQ(step.forward_collectives, 2 * kLayers);
  EXPECT_EQ(static_cast<int64_t>(counts.collectives_issued), 2 * kLayers);
  EXPECT_EQ(step.backward_collectives, GetParam().reissues ? 2 * kLayers : 0);
  EXPECT_EQ(static_cast<int64_t>(counts.collectives_reissued), step.backward_collectives);
  expect_bit_identical(reference.shard_grads, step.shard_grads);
}

INSTANTIATE_TEST_SUITE_P(
    TwoRanks, Policies,
    ::testing::Values(
        PolicyCase{"never_recompute_collectives", sac::never_recompute_collectives, false},
        PolicyCase{"dots_and_collectives",
                   [] {
                     return sac::any_of({sac::dots_saveable(), sac::never_recompute_collectives()});
                   },
                   false},
        PolicyCase{"everything_saveable", sac::everything_saveable, false},
        // torchtitan keeps reduce_scatter and all_to_all, not all_gather or
        // all_reduce: those are issued again, in the forward's order.
        PolicyCase{"torchtitan_default", sac::torchtitan_default, true},
        PolicyCase{"nothing_saveable", sac::nothing_saveable, true}),
    [](const auto& info) { return info.param.name; });

TEST(TwoRanks, FullCheckpointingIssuesEveryCollectiveAgain) {
  const Step reference = sharded_step(plain());
  const Step step = sharded_step(checkpointed(sac::CheckpointOptions()));
  EXPECT_EQ(step.forward_collectives, 2 * kLayers);
  EXPECT_EQ(step.backward_collectives, 2 * kLayers);
  expect_bit_identical(reference.shard_grads, step.shard_grads);
}

// ---- Against one process and against unsharded data parallelism ----------

// The whole computation of both ranks in one process: the same weights and
// inputs, sums over ranks computed directly. The sharded gradient is the
// gradient of the summed loss averaged over the ranks (AllGather's backward),
// so the reference is that, sliced to this rank's shard.
std::vector<at::Tensor> single_process_shard_grads() {
  const auto weights = full_weights();
  std::vector<at::Tensor> w;
  for (const auto& full : weights) {
    w.push_back(full.clone().requires_grad_());
  }
  std::vector<at::Tensor> h;
  for (int r = 0; r < ranks(); ++r) {
    h.push_back(input_of(r));
  }
  for (const auto& wl : w) {
    std::vector<at::Tensor> hidden;
    for (const auto& x : h) {
      hidden.push_back(torch::mm(x, wl).relu());
    }
    at::Tensor sum = hidden[0];
    for (size_t r = 1; r < hidden.size(); ++r) {
      sum = sum + hidden[r];
    }
    for (size_t r = 0; r < hidden.size(); ++r) {
      h[r] = torch::tanh(sum) * hidden[r];
    }
  }
  at::Tensor loss = h[0].sum();
  for (size_t r = 1; r < h.size(); ++r) {
    loss = loss + h[r].sum();
  }
  loss.backward();
  std::vector<at::Tensor> grads;
  for (const auto& wl : w) {
    grads.push_back(shard_of(wl.grad() / ranks(), rank()));
  }
  return grads;
}

TEST(TwoRanks, GradientsMatchOneProcessWithinRounding) {
  // Not bit for bit: one process sums the loss over the ranks in another
  // order than the ranks' all-reduces and reduce-scatter do. float32 sums of
  // a few terms of this size differ in the last bits only.
  const auto expected = single_process_shard_grads();
  const Step step = sharded_step(checkpointed(sac::CheckpointOptions().policy(
      sac::any_of({sac::dots_saveable(), sac::never_recompute_collectives()}))));
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(torch::allclose(step.shard_grads[i], expected[i], /*rtol=*/1e-5, /*atol=*/1e-6))
        << "layer " << i << ": max difference "
        << (step.shard_grads[i] - expected[i]).abs().max().item<float>();
  }
}

TEST(TwoRanks, ShardedGradientsEqualUnshardedDataParallel) {
  // Unsharded: every rank holds every weight; the gradients are averaged by
  // bucketed all-reduces from autograd hooks (DDP). With two ranks each sum
  // has two terms, so the order cannot differ: bit for bit.
  const auto weights = full_weights();
  std::vector<at::Tensor> params;
  for (const auto& w : weights) {
    params.push_back(w.clone().requires_grad_());
  }
  dist::GradientAllReduce reducer(params, bwd(), /*bucket_bytes=*/kWidth * kWidth * 4);
  const auto options = sac::CheckpointOptions().policy(sac::never_recompute_collectives());
  at::Tensor h = input_of(rank());
  for (const auto& w : params) {
    h = sac::checkpoint(
        options,
        [](const at::Tensor& x, const at::Tensor& w) {
          return layer(x, w, [](const at::Tensor& v) {
            return dist::SumOverRanks::apply(v, &fwd(), &bwd());
          });
        },
        h, w);
  }
  h.sum().backward();
  reducer.finish();
  EXPECT_EQ(reducer.buckets(), kLayers);

  const Step sharded = sharded_step(checkpointed(options));
  for (size_t i = 0; i < params.size(); ++i) {
    expect_bit_identical({shard_of(params[i].grad(), rank())}, {sharded.shard_grads[i]});
  }
}

// ---- Defined behaviour when a recomputation would communicate differently ---

TEST(TwoRanks, ARecomputationThatWouldIssueAnotherCollectiveFailsBeforeIssuingIt) {
  // The region reads a flag it does not take as input: its recomputation
  // issues one all-reduce more than its forward, first. That one matches the
  // forward's first all-reduce and is served from the cache; the layer's
  // own all-reduce is then one call too many. Both ranks fail with sac's
  // error instead of communicating, and the group stays usable.
  bool extra = false;
  const auto region = [&extra](const at::Tensor& x, const at::Tensor& shard) {
    const at::Tensor h = extra ? dist::SumOverRanks::apply(x, &fwd(), &bwd()) : x;
    return sharded_layer(h, shard);
  };
  const auto shard = shard_of(full_weights()[0], rank()).requires_grad_();
  const at::Tensor y =
      sac::checkpoint(sac::CheckpointOptions().policy(sac::never_recompute_collectives()), region,
                      input_of(rank()), shard);
  extra = true;
  const int64_t before = fwd().issued();
  const std::string message = error_of([&] { y.sum().backward(); });
  EXPECT_NE(message.find("would issue collective _c10d_functional::all_reduce"), std::string::npos)
      << message;
  EXPECT_NE(message.find("forward issued 1 such calls"), std::string::npos) << message;
  EXPECT_EQ(fwd().issued(), before);

  // Still in step: a sum over the ranks gives the expected value.
  at::Tensor one;
  {
    torch::NoGradGuard no_grad;
    one = dist::wait_tensor(dist::all_reduce(torch::ones({1}), "sum", fwd().name));
  }
  EXPECT_EQ(one.item<float>(), static_cast<float>(ranks()));
}

TEST(TwoRanks, ARecomputedCollectiveOfAnotherShapeFailsBeforeIssuingIt) {
  int64_t rows = kRows;
  const auto region = [&rows](const at::Tensor& x) {
    at::Tensor part = x.narrow(0, 0, rows).relu();
    return dist::SumOverRanks::apply(part, &fwd(), &bwd()).sum() * x;
  };
  const at::Tensor x = input_of(rank()).requires_grad_();
  const at::Tensor y =
      sac::checkpoint(sac::CheckpointOptions().policy(sac::nothing_saveable()), region, x);
  rows = kRows - 1;
  const int64_t before = fwd().issued();
  const std::string message = error_of([&] { y.sum().backward(); });
  EXPECT_NE(message.find("with (Float[3, 16], sum, fwd)"), std::string::npos) << message;
  EXPECT_NE(message.find("forward issued it with (Float[4, 16], sum, fwd)"), std::string::npos)
      << message;
  EXPECT_EQ(fwd().issued(), before);
}

// ---- Regions replay their collectives, once the ranks agree ----------------

TEST(TwoRanks, RegionsReplayTheirCollectivesAfterTheRanksAgree) {
  if (!regions_available()) GTEST_SKIP() << "sac::CheckpointRegion needs the fallback mechanism";
  const Step reference = sharded_step(plain());
  struct Case {
    const char* name;
    std::optional<sac::Policy> policy;
    int64_t reissued;  // per layer: the all-gather and the all-reduce, or none
  };
  for (const Case& c : {Case{"full", std::nullopt, 2}, Case{"dots", sac::dots_saveable(), 2},
                        Case{"keep collectives", sac::never_recompute_collectives(), 0}}) {
    SCOPED_TRACE(c.name);
    sac::CheckpointOptions options;
    auto stats = std::make_shared<sac::RegionStatistics>();
    if (c.policy) options.policy(*c.policy).statistics(stats);
    const Step step = sharded_step(in_a_region(options));
    EXPECT_EQ(step.forward_collectives, 2 * kLayers);
    // What each region's replay issues again, and one agreement per region.
    EXPECT_EQ(step.backward_collectives, (c.reissued + 1) * kLayers);
    if (c.policy) {  // and what sac counts of them
      const sac::RegionStatistics::Counts counts = stats->read();
      EXPECT_EQ(static_cast<int64_t>(counts.collectives_issued), 2 * kLayers);
      EXPECT_EQ(static_cast<int64_t>(counts.collectives_reissued), c.reissued * kLayers);
      EXPECT_EQ(static_cast<int64_t>(counts.agreements), kLayers);
    }
    expect_bit_identical(reference.shard_grads, step.shard_grads);
  }
}

TEST(TwoRanks, ARankReplayingAnotherRegionFailsOnEveryRank) {
  // Rank 1's loss does not use the second layer: its backward replays the
  // first layer's region while rank 0 replays the second's. The gathers have
  // the same shapes: without the agreement rank 0 would gather the first
  // layer's shards as the second's. Every rank fails with sac's error, and
  // the group stays usable.
  if (!regions_available()) GTEST_SKIP() << "sac::CheckpointRegion needs the fallback mechanism";
  const auto weights = full_weights();
  std::vector<at::Tensor> shards;
  for (const auto& w : weights) shards.push_back(shard_of(w, rank()).requires_grad_());
  const Runner run = in_a_region(sac::CheckpointOptions());
  const at::Tensor first = run(input_of(rank()), shards[0]);
  const at::Tensor second = run(first, shards[1]);
  const at::Tensor loss = rank() == 1 ? first.sum() : second.sum();
  const int64_t before = fwd().issued();
  const std::string message = error_of([&] { loss.backward(); });
  EXPECT_NE(message.find("the ranks of process group 'fwd' are about to replay different "
                         "regions"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("rank 1 of the group: the group's collectives"), std::string::npos)
      << message;
  EXPECT_EQ(fwd().issued(), before + 1);  // the agreement, nothing replayed

  at::Tensor one;
  {
    torch::NoGradGuard no_grad;
    one = dist::wait_tensor(dist::all_reduce(torch::ones({1}), "sum", fwd().name));
  }
  EXPECT_EQ(one.item<float>(), static_cast<float>(ranks()));
}

// ---- Async collectives: wait_tensor inside the region ------------------------

TEST(TwoRanks, AsyncCollectivesWaitedInsideTheRegion) {
  // The all-reduce is issued, other work overlaps it, then wait_tensor. When
  // the policy keeps it, the recomputation waits on the served tensor, which
  // has nothing in flight; when not, it is issued and waited again.
  const auto region = [](const at::Tensor& x) {
    at::Tensor pending;
    {
      torch::NoGradGuard no_grad;  // a constant: the ranks' row counts
      pending =
          dist::all_reduce(torch::full({1}, static_cast<double>(x.size(0))), "sum", fwd().name);
    }
    const at::Tensor h = torch::sigmoid(x) * 3;
    return h * dist::wait_tensor(pending);
  };
  const auto run = [&](std::optional<sac::Policy> policy) {
    const at::Tensor x = input_of(rank()).requires_grad_();
    const int64_t before = fwd().issued();
    const at::Tensor y =
        policy ? sac::checkpoint(sac::CheckpointOptions().policy(*policy), region, x) : region(x);
    const int64_t forward = fwd().issued() - before;
    y.sum().backward();
    return std::make_tuple(x.grad(), forward, fwd().issued() - before - forward);
  };
  const auto [reference, f0, b0] = run(std::nullopt);
  const auto [kept, f1, b1] = run(sac::never_recompute_collectives());
  const auto [rerun, f2, b2] = run(sac::nothing_saveable());
  EXPECT_EQ(f0, 1);
  EXPECT_EQ(b0, 0);
  EXPECT_EQ(f1, 1);
  EXPECT_EQ(b1, 0);
  EXPECT_EQ(f2, 1);
  EXPECT_EQ(b2, 1);
  expect_bit_identical({reference}, {kept});
  expect_bit_identical({reference}, {rerun});
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  World w{dist::rendezvous_from_env(kTimeout)};
  w.fwd.emplace(dist::make_group(w.rendezvous, "fwd", kTimeout));
  w.bwd.emplace(dist::make_group(w.rendezvous, "bwd", kTimeout));
  world = &w;
  std::printf("rank %d of %d, SAC_DISPATCH=%s\n", w.rendezvous.rank, w.rendezvous.world,
              std::getenv("SAC_DISPATCH") ? std::getenv("SAC_DISPATCH") : "(unset)");
  const int status = RUN_ALL_TESTS();
  world = nullptr;
  return status;
}
