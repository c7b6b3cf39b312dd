// The policy lab: profiles, the exact knapsack and budgeted policies. Bytes
// are counted exactly on the counting allocator.
#include "support.h"

#include <sac/lab/budget.h>
#include <sac/lab/explain.h>
#include <sac/lab/internal/knapsack.h>
#include <sac/lab/profile.h>
#include <sac/policy/internal/answers.h>

#include <torch/csrc/autograd/profiler_legacy.h>

#include <cmath>
#include <limits>
#include <random>
#include <sstream>

namespace lab_test {

using sac_test::CountingAllocator;
using sac_test::expect_bit_identical;
using sac_test::GptBlock;
using sac_test::run_and_grad;

class Lab : public ::testing::Test {
 protected:
  void SetUp() override {
    sac_test::expect_configured_mechanism();
    CountingAllocator::install();
    at::set_num_threads(1);
  }
};

// Bytes a region keeps after its forward under `policy` (beyond its output),
// and [output, gradients].
struct Outcome {
  int64_t kept = 0;
  std::vector<at::Tensor> grads;
};

// The region's output is dropped before counting (its sum kept): its storage
// then stays only if the policy keeps the call that returned it.
Outcome run(GptBlock& block, const at::Tensor& x, const sac::Policy& policy) {
  torch::manual_seed(7);
  const int64_t base = CountingAllocator::live_bytes();
  at::Tensor y = sac::checkpoint(
      sac::CheckpointOptions().policy(policy),
      [&](const at::Tensor& in) { return block->forward(in); }, x);
  const at::Tensor loss = y.sum();
  y = at::Tensor();
  Outcome out;
  out.kept = CountingAllocator::live_bytes() - base - static_cast<int64_t>(loss.nbytes());
  std::vector<at::Tensor> wrt{x};
  for (const auto& p : block->parameters()) {
    wrt.push_back(p);
  }
  out.grads = torch::autograd::grad({loss}, wrt);
  out.grads.insert(out.grads.begin(), loss.detach());
  return out;
}

// [sum of the output, gradients], as run() gives them.
std::vector<at::Tensor> plain(GptBlock& block, const at::Tensor& x) {
  auto out = run_and_grad([&] { return block->forward(x); }, {x}, block->parameters(), 7);
  out[0] = out[0].sum();
  return out;
}

sac::RegionProfile profile_of(GptBlock& block, const at::Tensor& x) {
  torch::manual_seed(7);
  return sac::profile([&] { block->forward(x); });
}

// What saving a call keeps is what the profile says: in all, the bytes
// everything_saveable() keeps after the forward.
TEST_F(Lab, ProfileBytesAreTheBytesSavingKeeps) {
  torch::manual_seed(0);
  GptBlock block(64, 4, 0.1);
  const at::Tensor x = torch::randn({2, 16, 64}, torch::requires_grad());
  const sac::RegionProfile p = profile_of(block, x);
  const Outcome none = run(block, x, sac::nothing_saveable());
  const Outcome all = run(block, x, sac::everything_saveable());
  EXPECT_GT(p.keepable_bytes(), 0);
  EXPECT_EQ(all.kept - none.kept, p.keepable_bytes());
  size_t cacheable = 0;
  for (const auto& c : p.calls()) {
    cacheable += c.cacheable ? 1 : 0;
    EXPECT_GE(c.seconds, 0);
    if (c.view) {
      EXPECT_EQ(c.output_bytes, 0) << c10::toString(c.op.operator_name());
    }
  }
  EXPECT_GT(cacheable, 5u);
  std::ostringstream table, csv;
  p.print(table, sac::RegionProfile::SortBy::Bytes, 5);
  p.write_csv(csv);
  EXPECT_NE(table.str().find("keepable"), std::string::npos);
  const std::string rows = csv.str();
  EXPECT_EQ(std::count(rows.begin(), rows.end(), '\n'), static_cast<long>(p.calls().size()) + 1);
}

// The exact solver against brute force on small random problems.
TEST_F(Lab, KnapsackMatchesBruteForce) {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t n = 1 + rng() % 14;
    std::vector<sac::detail::Item> items(n);
    int64_t total = 0;
    for (auto& item : items) {
      item.weight = static_cast<int64_t>(rng() % 100);
      item.value = static_cast<double>(rng() % 1000) / 7.0;
      total += item.weight;
    }
    const int64_t capacity = static_cast<int64_t>(rng() % (total + 1));
    double best = 0;
    for (uint64_t mask = 0; mask < (uint64_t{1} << n); ++mask) {
      int64_t weight = 0;
      double value = 0;
      for (size_t i = 0; i < n; ++i) {
        if (mask >> i & 1) {
          weight += items[i].weight;
          value += items[i].value;
        }
      }
      if (weight <= capacity) {
        best = std::max(best, value);
      }
    }
    const auto choice = sac::detail::solve_knapsack(items, capacity);
    ASSERT_TRUE(choice.exact);
    EXPECT_LE(choice.weight, capacity);
    EXPECT_NEAR(choice.value, best, 1e-9) << "trial " << trial;
  }
}

// With groups: a region's whole item (not checkpointed) excludes its calls.
// Equal weights are common (identical blocks), to exercise the cut.
TEST_F(Lab, KnapsackWithWholeItemsMatchesBruteForce) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 600; ++trial) {
    const int groups = 1 + static_cast<int>(rng() % 3);
    std::vector<sac::detail::Item> items;
    for (int g = 0; g < groups; ++g) {
      const size_t calls = 1 + rng() % 4;
      int64_t sum = 0;
      double time = 0;
      for (size_t c = 0; c < calls; ++c) {
        sac::detail::Item item;
        item.weight = static_cast<int64_t>(10 * (1 + rng() % 5));
        item.value = static_cast<double>(rng() % 100) / 3.0;
        item.group = rng() % 5 == 0 ? -1 : g;  // now and then an item of no group
        sum += item.weight;
        time += item.value;
        items.push_back(item);
      }
      sac::detail::Item whole;
      whole.weight = static_cast<int64_t>(rng() % (sum + 20));
      whole.value = time + static_cast<double>(rng() % 30);
      whole.group = g;
      whole.whole = true;
      items.push_back(whole);
    }
    std::shuffle(items.begin(), items.end(), rng);
    const size_t n = items.size();
    int64_t total = 0;
    for (const auto& item : items) total += item.weight;
    const int64_t capacity = static_cast<int64_t>(rng() % (total + 1));
    double best = 0;
    for (uint64_t mask = 0; mask < (uint64_t{1} << n); ++mask) {
      int64_t weight = 0;
      double value = 0;
      std::vector<int> wholes(groups, 0), others(groups, 0);
      for (size_t i = 0; i < n; ++i) {
        if (mask >> i & 1) {
          weight += items[i].weight;
          value += items[i].value;
          if (items[i].group >= 0) ++(items[i].whole ? wholes : others)[items[i].group];
        }
      }
      bool allowed = weight <= capacity;
      for (int g = 0; g < groups; ++g) allowed = allowed && (wholes[g] == 0 || others[g] == 0);
      if (allowed) best = std::max(best, value);
    }
    const auto choice = sac::detail::solve_knapsack(items, capacity);
    ASSERT_TRUE(choice.exact);
    EXPECT_LE(choice.weight, capacity);
    EXPECT_NEAR(choice.value, best, 1e-9) << "trial " << trial;
    std::vector<int> wholes(groups, 0), others(groups, 0);
    for (const size_t i : choice.chosen) {
      if (items[i].group >= 0) ++(items[i].whole ? wholes : others)[items[i].group];
    }
    for (int g = 0; g < groups; ++g) {
      EXPECT_TRUE(wholes[g] == 0 || others[g] == 0) << "trial " << trial << ", group " << g;
    }
  }
}

// The budgeted policy keeps what the plan predicts, never more than the
// budget, with bit-identical gradients.
TEST_F(Lab, BudgetedPolicyKeepsWhatItPredictsWithinItsBudget) {
  torch::manual_seed(0);
  GptBlock block(64, 4, 0.1);
  const at::Tensor x = torch::randn({2, 16, 64}, torch::requires_grad());
  const auto expected = plain(block, x);
  const sac::RegionProfile p = profile_of(block, x);
  const Outcome none = run(block, x, sac::nothing_saveable());
  for (const double fraction : {0.0, 0.1, 0.25, 0.5, 0.75, 1.0}) {
    SCOPED_TRACE(fraction);
    const auto plan =
        sac::budgeted_plan({p}, sac::Budget::of_everything_saveable(fraction), std::nullopt, false);
    EXPECT_TRUE(plan.exact);
    EXPECT_LE(plan.saved_bytes, plan.budget_bytes);
    const Outcome out = run(block, x, plan.policies[0]);
    EXPECT_EQ(out.kept - none.kept, plan.saved_bytes);
    expect_bit_identical(expected, out.grads);
  }
}

// With early stop, a recomputation ends once autograd has saved again what
// it saved in the forward: the calls after the last save are never run
// again, so the profile marks them past the stop, keeping them saves
// nothing, and a plan neither keeps them nor counts their time. At every
// budget the recomputation runs exactly the calls the plan predicts (counted
// by the region's statistics) and the gradients are the plain step's.
TEST_F(Lab, TheRecomputationRunsOnlyTheCallsBeforeItsStop) {
  torch::manual_seed(0);
  const at::Tensor x = torch::randn({8, 16}, torch::requires_grad());
  const at::Tensor w1 = torch::randn({16, 16}, torch::requires_grad());
  const at::Tensor w2 = torch::randn({16, 16}, torch::requires_grad());
  // mm saves its inputs before it runs, tanh its output after; the second
  // mm's inputs are the last tensors saved, and add saves nothing.
  auto region = [&](const at::Tensor& in) {
    const at::Tensor c = in.mm(w1).tanh().mm(w2);
    return c + c;
  };
  const sac::RegionProfile p = sac::profile([&] { return region(x); });
  ASSERT_EQ(p.calls().size(), 4u);
  std::vector<bool> past_stop;
  for (const auto& call : p.calls()) {
    past_stop.push_back(call.past_stop);
  }
  EXPECT_EQ(past_stop, (std::vector<bool>{false, false, true, true}));
  EXPECT_EQ(p.keepable_seconds(), p.calls()[0].seconds + p.calls()[1].seconds);

  const auto expected = run_and_grad([&] { return region(x); }, {x, w1, w2}, {}, 7);
  for (const double fraction : {0.0, 0.3, 0.6, 1.0}) {
    SCOPED_TRACE(fraction);
    const auto plan =
        sac::budgeted_plan({p}, sac::Budget::of_everything_saveable(fraction), std::nullopt, false);
    for (const auto& kept : plan.saved_calls[0]) {
      for (const auto& call : p.calls()) {
        EXPECT_FALSE(call.op == kept.op && call.call == kept.call && call.past_stop)
            << c10::toString(kept.op.operator_name()) << " #" << kept.call << " is kept";
      }
    }
    auto stats = std::make_shared<sac::RegionStatistics>();
    const auto out = run_and_grad(
        [&] {
          return sac::checkpoint(sac::CheckpointOptions()
                                     .policy(sac_examples::asked_about_every_call(plan.policies[0]))
                                     .statistics(stats),
                                 region, x);
        },
        {x, w1, w2}, {}, 7);
    expect_bit_identical(expected, out);
    EXPECT_EQ(stats->read().calls_rerun, sac_examples::predicted_reruns(p, plan.saved_calls[0]));
  }
  const auto all =
      sac::budgeted_plan({p}, sac::Budget::of_everything_saveable(1.0), std::nullopt, false);
  EXPECT_EQ(all.recompute_seconds, 0.0);
  EXPECT_EQ(all.saved_calls[0].size(), 2u) << "the first mm and tanh; nothing past the stop";

  // Without autograd recording nothing is saved, and the profile could not
  // tell: it refuses.
  torch::NoGradGuard no_grad;
  EXPECT_NE(sac_test::error_of([&] {
              sac::profile([&] { return region(x); });
            }).find("autograd is not recording"),
            std::string::npos);
}

// On a GPT block, the recomputation runs the calls the plan predicts at
// every budget, and the block's last calls are past the stop.
TEST_F(Lab, AGptBlocksRecomputationRunsWhatThePlanPredicts) {
  torch::manual_seed(0);
  GptBlock block(64, 4, 0.0);
  const at::Tensor x = torch::randn({2, 16, 64}, torch::requires_grad());
  const sac::RegionProfile p = profile_of(block, x);
  EXPECT_TRUE(p.calls().back().past_stop) << "the residual add saves nothing";
  EXPECT_FALSE(p.calls().front().past_stop);
  for (const double fraction : {0.0, 0.1, 0.25, 0.5, 0.75, 1.0}) {
    SCOPED_TRACE(fraction);
    const auto plan =
        sac::budgeted_plan({p}, sac::Budget::of_everything_saveable(fraction), std::nullopt, false);
    auto stats = std::make_shared<sac::RegionStatistics>();
    torch::manual_seed(7);
    const at::Tensor y = sac::checkpoint(
        sac::CheckpointOptions()
            .policy(sac_examples::asked_about_every_call(plan.policies[0]))
            .statistics(stats),
        [&](const at::Tensor& in) { return block->forward(in); }, x);
    y.sum().backward();
    EXPECT_EQ(stats->read().calls_rerun, sac_examples::predicted_reruns(p, plan.saved_calls[0]));
  }
}

// A matmul of a 3-D input is aten::mm and an aten::_unsafe_view of its
// result: two cacheable calls on one storage. Saving the view alone keeps
// the matmul's bytes, so a plan saves both or neither, and at every budget a
// checkpoint keeps exactly the plan's bytes (found on Hugging Face's Llama,
// where the view alone was chosen as free and the budget overrun).
TEST_F(Lab, CallsSharingAStorageAreSavedTogether) {
  torch::manual_seed(0);
  const at::Tensor x = torch::randn({2, 8, 16}, torch::requires_grad());
  const at::Tensor w = torch::randn({16, 32}, torch::requires_grad());
  auto fn = [&](const at::Tensor& in) {
    return torch::matmul(torch::tanh(torch::matmul(in, w)), w.t());
  };
  const sac::RegionProfile p = sac::profile([&] { fn(x); });
  size_t sharing = 0;
  for (const auto& c : p.calls()) {
    if (!c.shares_storage_with.empty() && c.keepable()) {
      ++sharing;
      EXPECT_EQ(c.output_bytes, 0) << c10::toString(c.op.operator_name());
      EXPECT_GT(p.calls()[c.shares_storage_with.front()].output_bytes, 0);
    }
  }
  EXPECT_GE(sharing, 1u);

  auto kept_by = [&](const sac::Policy& policy, std::vector<at::Tensor>* grads) {
    const int64_t base = CountingAllocator::live_bytes();
    at::Tensor y = sac::checkpoint(sac::CheckpointOptions().policy(policy), fn, x);
    const at::Tensor loss = y.sum();
    y = at::Tensor();
    const int64_t kept =
        CountingAllocator::live_bytes() - base - static_cast<int64_t>(loss.nbytes());
    *grads = torch::autograd::grad({loss}, {x, w});
    return kept;
  };
  const std::vector<at::Tensor> expected = torch::autograd::grad({fn(x).sum()}, {x, w});
  std::vector<at::Tensor> grads;
  const int64_t none = kept_by(sac::nothing_saveable(), &grads);
  for (const double fraction : {0.0, 0.2, 0.4, 0.6, 0.8, 1.0}) {
    SCOPED_TRACE(fraction);
    const auto plan =
        sac::budgeted_plan({p}, sac::Budget::of_everything_saveable(fraction), std::nullopt, false);
    EXPECT_LE(plan.saved_bytes, plan.budget_bytes);
    EXPECT_EQ(kept_by(plan.policies[0], &grads) - none, plan.saved_bytes);
    expect_bit_identical(expected, grads);
  }
}

// A region that returns its output (a block's, a loss): the call that made
// it keeps none of its bytes when saved, since the caller holds them, and a
// plan's saved bytes are what checkpointing keeps beyond the output.
TEST_F(Lab, WhatTheRegionReturnsIsTheCallers) {
  torch::manual_seed(0);
  const at::Tensor x = torch::randn({8, 16}, torch::requires_grad());
  const at::Tensor w = torch::randn({16, 16}, torch::requires_grad());
  auto fn = [&](const at::Tensor& in) { return torch::mm(torch::tanh(torch::mm(in, w)), w); };
  const sac::RegionProfile unreturned = sac::profile([&] { fn(x); }, 1);
  const sac::RegionProfile p = sac::profile([&] { return fn(x); }, 1);
  ASSERT_EQ(p.calls().size(), unreturned.calls().size());
  const sac::OpCallProfile& last = p.calls().back();
  EXPECT_EQ(c10::toString(last.op.operator_name()), "aten::mm");
  EXPECT_TRUE(last.returned);
  EXPECT_EQ(last.output_bytes, 0);
  EXPECT_FALSE(unreturned.calls().back().returned);
  EXPECT_EQ(unreturned.calls().back().output_bytes, 8 * 16 * 4);
  EXPECT_EQ(p.keepable_bytes(), unreturned.keepable_bytes() - 8 * 16 * 4);
  // A region that returns nothing let its graph go as it returned: what it
  // keeps unchecked is not measured, so no plan leaves it unchecked.
  EXPECT_EQ(p.plain_bytes(), 8 * 16 * 4);  // tanh's output, which its backward needs
  EXPECT_EQ(unreturned.plain_bytes(), -1);
  EXPECT_TRUE(sac::budgeted_plan({unreturned}, sac::Budget::bytes(1 << 20)).checkpointed[0]);
  EXPECT_FALSE(sac::budgeted_plan({p}, sac::Budget::bytes(1 << 20)).checkpointed[0]);
  // Tuples and vectors are read too; a storage returned twice is the caller's once.
  const auto pair = sac::profile(
      [&] {
        const at::Tensor y = fn(x);
        return std::make_tuple(y, std::vector<at::Tensor>{y.view({-1})});
      },
      1);
  EXPECT_EQ(pair.calls().back().output_bytes, 0);

  const std::vector<at::Tensor> expected = torch::autograd::grad({fn(x).sum()}, {x, w});
  auto kept_by = [&](const sac::Policy& policy, std::vector<at::Tensor>* grads) {
    const int64_t base = CountingAllocator::live_bytes();
    const at::Tensor y = sac::checkpoint(sac::CheckpointOptions().policy(policy), fn, x);
    const int64_t kept = CountingAllocator::live_bytes() - base;  // y held, as a step holds it
    *grads = torch::autograd::grad({y.sum()}, {x, w});
    return kept;
  };
  std::vector<at::Tensor> grads;
  const int64_t none = kept_by(sac::nothing_saveable(), &grads);
  for (const double fraction : {0.5, 1.0}) {
    SCOPED_TRACE(fraction);
    const auto plan =
        sac::budgeted_plan({p}, sac::Budget::of_everything_saveable(fraction), std::nullopt, false);
    EXPECT_EQ(kept_by(plan.policies[0], &grads) - none, plan.saved_bytes);
    expect_bit_identical(expected, grads);
  }
}

// Not checkpointing as a choice per region (unchecked_regions): at every
// budget the plan is never worse than leaving a region unchecked (a
// checkpointed region keeps fewer bytes than it would unchecked, or
// recomputes nothing), a budget of the plain step's bytes recomputes
// nothing, and the plan keeps its saved bytes, counted by the allocator,
// with gradients bit-identical, under sac::checkpoint and the region guard.
TEST_F(Lab, UncheckedRegionsMakePlansNeverWorseThanNotCheckpointing) {
  torch::manual_seed(0);
  std::vector<GptBlock> blocks;
  for (int b = 0; b < 3; ++b) blocks.emplace_back(32, 4, /*dropout=*/0.0);
  const at::Tensor x = torch::randn({2, 8, 32}, torch::requires_grad());
  std::vector<sac::RegionProfile> profiles;
  int64_t plain = 0;
  {
    at::Tensor h = x;
    for (auto& block : blocks) {
      profiles.push_back(sac::profile([&] { return block->forward(h); }, 1));
      plain += profiles.back().plain_bytes();
      h = block->forward(h);
    }
  }
  std::vector<at::Tensor> params{x};
  for (auto& block : blocks) {
    for (const auto& p : block->parameters()) params.push_back(p);
  }
  // Kept after the forward beyond full recomputation's, and the gradients,
  // with each block under `policies` (as a checkpoint or a region).
  auto run = [&](const std::vector<sac::Policy>& policies, bool region,
                 std::vector<at::Tensor>* grads) {
    const int64_t base = CountingAllocator::live_bytes();
    at::Tensor h = x;
    for (size_t b = 0; b < blocks.size(); ++b) {
      const auto options = sac::CheckpointOptions().policy(policies[b]);
      if (region) {
        sac::CheckpointRegion guard(options);
        h = blocks[b]->forward(h);
      } else {
        h = sac::checkpoint(
            options, [&, b](const at::Tensor& in) { return blocks[b]->forward(in); }, h);
      }
    }
    const int64_t kept = CountingAllocator::live_bytes() - base - static_cast<int64_t>(h.nbytes());
    *grads = torch::autograd::grad({h.sum()}, params);
    return kept;
  };
  std::vector<at::Tensor> expected, grads;
  {
    at::Tensor h = x;
    for (auto& block : blocks) h = block->forward(h);
    expected = torch::autograd::grad({h.sum()}, params);
  }
  const std::vector<sac::Policy> nothing(blocks.size(), sac::nothing_saveable());
  const bool regions = sac::dispatch::mechanism() == sac::dispatch::Mechanism::FallbackKey;
  int64_t everything = 0;
  for (const auto& p : profiles) everything += p.keepable_bytes();
  ASSERT_GT(everything, plain);
  int unchecked_seen = 0;
  for (int step = 0; step <= 10; ++step) {
    const int64_t budget = everything * step / 10;
    SCOPED_TRACE(budget);
    const auto plan = sac::budgeted_plan(profiles, sac::Budget::bytes(budget), std::nullopt, true);
    ASSERT_TRUE(plan.exact);
    EXPECT_LE(plan.saved_bytes, budget);
    for (size_t b = 0; b < blocks.size(); ++b) {
      EXPECT_EQ(plan.checkpointed[b], plan.policies[b].checkpoints());
      unchecked_seen += !plan.checkpointed[b];
      if (!plan.checkpointed[b]) continue;
      int64_t kept = 0;
      for (const auto& call : plan.saved_calls[b]) kept += call.bytes;
      double recomputed = 0;
      for (const auto& call : profiles[b].calls()) recomputed += call.seconds;
      for (const auto& call : plan.saved_calls[b]) {
        for (const auto& c : profiles[b].calls()) {
          if (c.op == call.op && c.call == call.call) recomputed -= c.seconds;
        }
      }
      EXPECT_TRUE(kept < profiles[b].plain_bytes() || recomputed <= 1e-12)
          << "block " << b << " keeps " << kept << " bytes checkpointed, "
          << profiles[b].plain_bytes() << " unchecked";
    }
    if (budget >= plain) {  // the plain step fits: nothing recomputed
      for (size_t b = 0; b < blocks.size(); ++b) EXPECT_FALSE(plan.checkpointed[b]) << b;
    }
    for (const bool region : {false, true}) {
      if (region && !regions) continue;
      SCOPED_TRACE(region ? "region" : "checkpoint");
      const int64_t none = run(nothing, region, &grads);
      EXPECT_EQ(run(plan.policies, region, &grads) - none, plan.saved_bytes);
      expect_bit_identical(expected, grads);
    }
  }
  EXPECT_GT(unchecked_seen, 0);
  // Without the choice, a budget of the plain step's bytes still recomputes.
  const auto checkpointed =
      sac::budgeted_plan(profiles, sac::Budget::bytes(plain), std::nullopt, false);
  EXPECT_GT(checkpointed.recompute_seconds, 0);
  // A context_fn cannot leave its region unchecked: refused, with advice.
  const auto unchecked =
      sac::budgeted_plan(profiles, sac::Budget::bytes(plain), std::nullopt, true);
  const std::string refused =
      sac_test::error_of([&] { sac::create_selective_checkpoint_contexts(unchecked.policies[0]); });
  EXPECT_NE(refused.find("leaves its region unchecked"), std::string::npos) << refused;
}

// A budget of the plain step's bytes is stated against not checkpointing:
// at 1.0 every region is unchecked, below it every plan saves bytes against
// not checkpointing and recomputes for them.
TEST_F(Lab, BudgetsOfThePlainStepAreSavingsAgainstNotCheckpointing) {
  torch::manual_seed(0);
  std::vector<GptBlock> blocks;
  for (int b = 0; b < 3; ++b) blocks.emplace_back(32, 4, /*dropout=*/0.0);
  std::vector<sac::RegionProfile> profiles;
  int64_t plain = 0;
  at::Tensor h = torch::randn({2, 8, 32}, torch::requires_grad());
  for (auto& block : blocks) {
    profiles.push_back(sac::profile([&] { return block->forward(h); }, 1));
    plain += profiles.back().plain_bytes();
    h = block->forward(h);
  }
  for (int step = 0; step <= 10; ++step) {
    const double fraction = step / 10.0;
    SCOPED_TRACE(fraction);
    const auto plan = sac::budgeted_plan(profiles, sac::Budget::fraction(fraction));
    EXPECT_LE(static_cast<double>(plan.budget_bytes), fraction * static_cast<double>(plain));
    EXPECT_GT(static_cast<double>(plan.budget_bytes + 1), fraction * static_cast<double>(plain));
    // The same plan as the budget in bytes.
    const auto in_bytes = sac::budgeted_plan(profiles, sac::Budget::bytes(plan.budget_bytes));
    EXPECT_EQ(plan.saved_bytes, in_bytes.saved_bytes);
    EXPECT_EQ(plan.recompute_seconds, in_bytes.recompute_seconds);
    if (step == 10) {
      EXPECT_EQ(plan.saved_bytes, plain);
      EXPECT_EQ(plan.recompute_seconds, 0);
      for (size_t b = 0; b < blocks.size(); ++b) EXPECT_FALSE(plan.checkpointed[b]) << b;
    } else {
      EXPECT_LT(plan.saved_bytes, plain);
      EXPECT_GT(plan.recompute_seconds, 0);
    }
  }
  const std::string outside = sac_test::error_of([] { sac::Budget::fraction(1.5); });
  EXPECT_NE(outside.find("in [0, 1]; got 1.5"), std::string::npos) << outside;
  // A profile made by hand has no plain bytes to be a fraction of.
  const sac::RegionProfile by_hand(profiles[0].calls());
  const std::string unmeasured =
      sac_test::error_of([&] { sac::budgeted_plan({by_hand}, sac::Budget::fraction(0.5)); });
  EXPECT_NE(unmeasured.find("plain_bytes() is -1"), std::string::npos) << unmeasured;
}

// What a region keeps when it is not checkpointed, as the profile measures
// it, is what the allocator counts beyond full recomputation's, to the byte.
TEST_F(Lab, PlainBytesAreWhatNotCheckpointingKeeps) {
  torch::manual_seed(0);
  GptBlock block(32, 4, /*dropout=*/0.1);
  const at::Tensor x = torch::randn({2, 8, 32}, torch::requires_grad());
  torch::manual_seed(7);
  const sac::RegionProfile p = sac::profile([&] { return block->forward(x); }, 1);
  ASSERT_GT(p.plain_bytes(), 0);
  auto kept_by = [&](const std::optional<sac::Policy>& policy) {
    torch::manual_seed(7);
    const int64_t base = CountingAllocator::live_bytes();
    const at::Tensor y = policy ? sac::checkpoint(
                                      sac::CheckpointOptions().policy(*policy),
                                      [&](const at::Tensor& in) { return block->forward(in); }, x)
                                : block->forward(x);
    return CountingAllocator::live_bytes() - base;  // y held
  };
  const int64_t plain = kept_by(std::nullopt);
  const int64_t nothing = kept_by(sac::nothing_saveable());
  EXPECT_EQ(plain - nothing, p.plain_bytes()) << "plain " << plain << ", nothing " << nothing;
  // Keeping every call keeps more than not checkpointing (views and outputs
  // autograd never saves), which is why a plan must weigh both.
  EXPECT_GT(p.keepable_bytes(), p.plain_bytes());
}

// A region whose first run initialises something (FSDP's lazy
// initialisation, a cache filled once) runs more op calls then than later:
// profiling it says how to leave that run out, and warmup = 1 does.
TEST_F(Lab, AFirstRunThatDiffersIsLeftOutByAWarmUp) {
  const at::Tensor x = torch::randn({4, 8}, torch::requires_grad());
  const at::Tensor w = torch::randn({8, 8});
  at::Tensor cache;
  auto region = [&] {
    if (!cache.defined()) {
      cache = torch::cos(w).exp();  // two more calls, once
    }
    torch::tanh(torch::mm(x, cache));
  };
  const std::string message = sac_test::error_of([&] { sac::profile(region); });
  EXPECT_NE(message.find("4 op calls in its first profiled run and 2 in run 2"), std::string::npos)
      << message;
  EXPECT_NE(message.find("warmup = 1"), std::string::npos) << message;

  cache = at::Tensor();
  const sac::RegionProfile p = sac::profile(region, 3, /*warmup=*/1);
  ASSERT_EQ(p.calls().size(), 2u);
  EXPECT_EQ(c10::toString(p.calls()[0].op.operator_name()), "aten::mm");
  EXPECT_EQ(c10::toString(p.calls()[1].op.operator_name()), "aten::tanh");
  // The advice is for the first profiled pair only: a later run that
  // differs is the region's control flow.
  int calls = 0;
  auto third_differs = [&] {
    torch::tanh(x);
    if (++calls == 3) torch::exp(x);
  };
  const std::string later = sac_test::error_of([&] { sac::profile(third_differs); });
  EXPECT_NE(later.find("in run 3"), std::string::npos) << later;
  EXPECT_EQ(later.find("warmup"), std::string::npos) << later;
  EXPECT_NE(sac_test::error_of([&] { sac::profile(region, 3, -1); }).find("warmup must be 0"),
            std::string::npos);
}

// Offload as a third choice, on synthetic profiles of calls on an
// accelerator and on the CPU: the plan's total cost (recomputed time plus
// trips to host memory) is the least any keep/offload/recompute assignment
// within the budget reaches (brute force), its policy answers as planned,
// and CPU calls are never offloaded.
TEST_F(Lab, OffloadIsAChoiceForAcceleratorCalls) {
  const c10::OperatorHandle mm = c10::Dispatcher::singleton().findSchemaOrThrow("aten::mm", "");
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t n = 1 + rng() % 8;
    std::vector<sac::OpCallProfile> calls;
    int64_t total = 0;
    for (size_t i = 0; i < n; ++i) {
      sac::OpCallProfile c{mm};
      c.call = i;
      c.cacheable = true;
      c.output_bytes = 1 + static_cast<int64_t>(rng() % 1000);
      c.seconds = static_cast<double>(rng() % 1000) * 1e-6;
      c.device = rng() % 3 == 0 ? c10::Device(c10::kCPU) : c10::Device(c10::kCUDA, 0);
      total += c.output_bytes;
      calls.push_back(c);
    }
    const sac::OffloadCost offload{static_cast<double>(1 + rng() % 4) * 1e6};
    const int64_t budget = static_cast<int64_t>(rng() % (total + 1));
    double best = std::numeric_limits<double>::infinity();
    std::vector<int> choice(n, 0);  // 0 recompute, 1 keep, 2 offload
    for (size_t code = 0; code < static_cast<size_t>(std::pow(3, n)); ++code) {
      size_t rest = code;
      int64_t kept = 0;
      double cost = 0;
      bool valid = true;
      for (size_t i = 0; i < n; ++i, rest /= 3) {
        const int c = static_cast<int>(rest % 3);
        if (c == 1) {
          kept += calls[i].output_bytes;
        } else if (c == 2) {
          valid = valid && calls[i].device.type() != c10::kCPU;
          cost += static_cast<double>(calls[i].output_bytes) / offload.bytes_per_second;
        } else {
          cost += calls[i].seconds;
        }
      }
      if (valid && kept <= budget) {
        best = std::min(best, cost);
      }
    }
    const auto plan =
        sac::budgeted_plan({sac::RegionProfile(calls)}, sac::Budget::bytes(budget), offload);
    ASSERT_TRUE(plan.exact);
    EXPECT_LE(plan.saved_bytes, budget);
    EXPECT_NEAR(plan.recompute_seconds + plan.offload_seconds, best, 1e-12) << "trial " << trial;
    int64_t kept = 0, offloaded = 0;
    for (const auto& c : calls) {
      sac::SelectiveCheckpointContext ctx;
      ctx.call = c.call;
      const sac::CheckpointPolicy answer = plan.policies[0].decide(ctx, mm, {});
      kept += sac::detail::is_save(answer) ? c.output_bytes : 0;
      offloaded += sac::detail::is_offload(answer) ? c.output_bytes : 0;
      if (c.device.type() == c10::kCPU) {
        EXPECT_FALSE(sac::detail::is_offload(answer));
      }
    }
    EXPECT_EQ(kept, plan.saved_bytes);
    EXPECT_EQ(offloaded, plan.offloaded_bytes);
  }
  const std::string message = sac_test::error_of([] { sac::measure_offload_bandwidth(c10::kCPU); });
  EXPECT_NE(message.find("accelerator"), std::string::npos) << message;
}

// A model's worth of items (twelve profiled blocks, times as measured) is
// solved exactly, under the default node limit, at every budget.
TEST_F(Lab, TwelveBlocksAreSolvedExactly) {
  torch::manual_seed(0);
  GptBlock block(64, 4, 0.0);
  const at::Tensor x = torch::randn({2, 16, 64}, torch::requires_grad());
  std::vector<sac::RegionProfile> profiles;
  for (int i = 0; i < 12; ++i) {
    profiles.push_back(profile_of(block, x));
  }
  for (const double fraction : {0.05, 0.2, 0.5, 0.8}) {
    for (const bool unchecked : {false, true}) {
      const auto plan = sac::budgeted_plan(profiles, sac::Budget::of_everything_saveable(fraction),
                                           std::nullopt, unchecked);
      EXPECT_TRUE(plan.exact) << fraction << (unchecked ? ", unchecked regions" : "");
      EXPECT_LE(plan.saved_bytes, plan.budget_bytes);
    }
  }
}

// More regions than the solver decides exactly whether to check
// (detail::kExactWholes): the local search keeps the plan within its budget,
// never keeps a region's calls worth its plain bytes while it recomputes,
// and leaves every region unchecked where the plain step fits.
TEST_F(Lab, ManyRegionsAreNeverWorseThanNotCheckpointing) {
  torch::manual_seed(0);
  GptBlock block(64, 4, 0.0);
  const at::Tensor x = torch::randn({2, 16, 64}, torch::requires_grad());
  std::vector<sac::RegionProfile> profiles;
  int64_t plain = 0, everything = 0;
  for (size_t i = 0; i < 2 * sac::detail::kExactWholes; ++i) {
    profiles.push_back(sac::profile([&] { return block->forward(x); }, 1));
    plain += profiles.back().plain_bytes();
    everything += profiles.back().keepable_bytes();
  }
  for (int step = 1; step <= 10; ++step) {
    const int64_t budget = everything * step / 10;
    const auto plan = sac::budgeted_plan(profiles, sac::Budget::bytes(budget), std::nullopt, true);
    EXPECT_FALSE(plan.exact);
    EXPECT_GE(plan.gap_seconds, 0);
    EXPECT_LE(plan.saved_bytes, budget);
    for (size_t r = 0; r < profiles.size(); ++r) {
      if (budget >= plain) EXPECT_FALSE(plan.checkpointed[r]) << budget << ", region " << r;
      if (!plan.checkpointed[r]) continue;
      int64_t kept = 0;
      for (const auto& call : plan.saved_calls[r]) kept += call.bytes;
      EXPECT_TRUE(kept < profiles[r].plain_bytes() ||
                  plan.saved_calls[r].size() == profiles[r].calls().size())
          << budget << ", region " << r;
    }
  }
}

// One budget across two blocks.
TEST_F(Lab, OneBudgetAcrossRegions) {
  torch::manual_seed(0);
  GptBlock a(64, 4, 0.0), b(64, 4, 0.0);
  const at::Tensor x = torch::randn({2, 16, 64}, torch::requires_grad());
  const at::Tensor h = a->forward(x).detach().requires_grad_();
  const auto plan =
      sac::budgeted_plan({profile_of(a, x), profile_of(b, h)},
                         sac::Budget::of_everything_saveable(0.4), std::nullopt, false);
  ASSERT_EQ(plan.policies.size(), 2u);
  const Outcome none_a = run(a, x, sac::nothing_saveable());
  const Outcome none_b = run(b, h, sac::nothing_saveable());
  const Outcome out_a = run(a, x, plan.policies[0]);
  const Outcome out_b = run(b, h, plan.policies[1]);
  EXPECT_EQ(out_a.kept - none_a.kept + out_b.kept - none_b.kept, plan.saved_bytes);
  EXPECT_LE(plan.saved_bytes, plan.budget_bytes);
}

// explain's outcomes are what the caching mode does: the bytes it reports
// kept are the bytes a checkpoint under the policy keeps, for op lists,
// callbacks, names and the budgeted policy; calls demoted by an in-place
// change (nn::Linear on 3-D input) are reported demoted.
TEST_F(Lab, ExplainReportsWhatTheCachingModeDoes) {
  torch::manual_seed(0);
  GptBlock block(64, 4, 0.1);
  const at::Tensor x = torch::randn({2, 16, 64}, torch::requires_grad());
  const Outcome none = run(block, x, sac::nothing_saveable());
  const sac::RegionProfile p = profile_of(block, x);
  for (const auto& policy :
       {sac::everything_saveable(), sac::compute_intensive_ops(), sac::dots_saveable(),
        sac::Policy::save_ops({"aten::mm", "aten::addmm"}),
        sac::budgeted_policy(p, sac::Budget::of_everything_saveable(0.3), std::nullopt, false)}) {
    SCOPED_TRACE(policy.describe());
    torch::manual_seed(7);
    const sac::Explanation e = sac::explain(policy, [&] { block->forward(x); });
    const Outcome out = run(block, x, policy);
    EXPECT_EQ(e.saved_bytes(), out.kept - none.kept);
    EXPECT_EQ(e.offloaded_bytes(), 0);
    for (const auto& call : e.calls()) {
      if (call.profile.modified_later && call.answer.has_value()) {
        EXPECT_EQ(call.outcome, sac::detail::is_save(*call.answer)
                                    ? sac::ExplainedCall::Outcome::Demoted
                                    : sac::ExplainedCall::Outcome::Recomputed);
      }
    }
  }
  std::ostringstream table;
  sac::explain(sac::everything_saveable(), [&] { block->forward(x); }).print(table);
  EXPECT_NE(table.str().find("PreferSave"), std::string::npos);
  EXPECT_NE(table.str().find("demoted"), std::string::npos) << "nn::Linear's mm, biased in place";
}

// The checkpointed forward and each recomputation are named scopes in the
// PyTorch profiler's trace.
TEST_F(Lab, TheProfilerTraceShowsTheForwardAndTheRecomputation) {
  torch::manual_seed(0);
  GptBlock block(64, 4, 0.0);
  const at::Tensor x = torch::randn({2, 16, 64}, torch::requires_grad());
  std::ostringstream trace;
  {
    torch::autograd::profiler::RecordProfile profiling(trace);
    const at::Tensor y = sac::checkpoint(
        sac::CheckpointOptions().policy(sac::dots_saveable()),
        [&](const at::Tensor& in) { return block->forward(in); }, x);
    y.sum().backward();
  }
  const std::string text = trace.str();
  EXPECT_NE(text.find("\"sac::checkpoint\""), std::string::npos);
  EXPECT_NE(text.find("\"sac::recompute\""), std::string::npos);
  EXPECT_NE(text.find("aten::addmm"), std::string::npos) << "a trace with ops in it";
}

}  // namespace lab_test
