// The op cache (sac/cache/internal/op_cache.h) on its own, as the modes drive
// it: a forward fills it call by call, a recomputation follows it by (op, call
// index), what was modified in place is demoted or refused, late decisions
// change a call's answer until the forward ends, and clear() leaves it new.
#include "support.h"

#include <sac/cache/internal/op_cache.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include <string>
#include <vector>

namespace cache_op_cache_test {

using sac::detail::OpCache;
using sac_test::error_of;

c10::OperatorHandle op_named(const char* name, const char* overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

struct Ops {
  c10::OperatorHandle add = op_named("aten::add", "Tensor");
  c10::OperatorHandle mul = op_named("aten::mul", "Tensor");
  c10::OperatorHandle add_ = op_named("aten::add_", "Tensor");
  c10::OperatorHandle div = op_named("aten::div", "Tensor");
};

size_t bytes_of(const at::Tensor& t) { return t.storage().nbytes(); }

// A forward of three calls: add (recomputed), mul (kept), add (kept).
struct Filled {
  explicit Filled(OpCache& cache, bool end = true) {
    cache.begin_forward();
    EXPECT_EQ(cache.calls_so_far(ops.add), 0u);
    cache.append_recompute(ops.add);
    EXPECT_EQ(cache.calls_so_far(ops.add), 1u);
    cache.append_kept(ops.mul, {product}, std::nullopt);
    cache.append_kept(ops.add, {sum}, std::nullopt);
    EXPECT_EQ(cache.calls_so_far(ops.add), 2u);
    if (end) {
      cache.end_forward();
    }
  }
  Ops ops;
  at::Tensor product = torch::randn({4, 4});
  at::Tensor sum = torch::randn({8});
};

TEST(OpCache, FollowsTheForwardsDecisionsByOpAndCall) {
  OpCache cache;
  EXPECT_TRUE(cache.empty());
  Filled forward(cache);
  const Ops& ops = forward.ops;
  EXPECT_FALSE(cache.empty());
  EXPECT_FALSE(cache.cached(ops.add, 0));
  EXPECT_TRUE(cache.cached(ops.mul, 0));
  EXPECT_TRUE(cache.cached(ops.add, 1));
  EXPECT_EQ(cache.kept_calls(), 2u);
  EXPECT_EQ(cache.bytes(), bytes_of(forward.product) + bytes_of(forward.sum));
  const OpCache::Summary summary = cache.summary();
  EXPECT_EQ(summary.saved_calls, 2u);
  EXPECT_EQ(summary.recompute_calls, 1u);
  EXPECT_EQ(summary.offloaded_calls, 0u);

  OpCache::Served served = cache.take(ops.mul, 0, /*allow_mutation=*/false);
  ASSERT_EQ(served.outputs.size(), 1u);
  EXPECT_TRUE(served.outputs[0].toTensor().is_alias_of(forward.product));
  EXPECT_FALSE(served.generator.has_value());
  EXPECT_EQ(cache.kept_calls(), 1u);
  EXPECT_EQ(cache.bytes(), bytes_of(forward.sum));
  EXPECT_TRUE(cache.cached(ops.mul, 0));  // served: never recomputed

  const std::string again = error_of([&] { cache.take(ops.mul, 0, false); });
  EXPECT_NE(again.find("Trying to backward an extra time"), std::string::npos) << again;
  EXPECT_NE(again.find("aten::mul.Tensor (call 0)"), std::string::npos) << again;

  // An early stop leaves the rest untaken: it goes, and cannot be taken.
  cache.release_untaken();
  EXPECT_EQ(cache.kept_calls(), 0u);
  EXPECT_EQ(cache.bytes(), 0u);
  EXPECT_NE(error_of([&] { cache.take(ops.add, 1, false); }).find("extra time"), std::string::npos);
}

TEST(OpCache, RefusesARecomputationThatPartsWaysWithTheForward) {
  OpCache cache;
  Filled forward(cache);
  const std::string never = error_of([&] { cache.cached(forward.ops.div, 0); });
  EXPECT_NE(never.find("aten::div.Tensor ran during recomputation but never in the "
                       "checkpointed forward"),
            std::string::npos)
      << never;
  const std::string more = error_of([&] { cache.cached(forward.ops.add, 5); });
  EXPECT_NE(more.find("aten::add.Tensor ran at least 6 times during recomputation but only 2 "
                      "times in the checkpointed forward"),
            std::string::npos)
      << more;
  EXPECT_NE(more.find("must run the same ops as the forward"), std::string::npos) << more;
}

// A backward inside the forward recomputes the region so far: past its end
// the calls run, and what it takes stays for the backward after the forward.
TEST(OpCache, WhileFillingServesAliasesAndRunsPastTheEnd) {
  OpCache cache;
  Filled forward(cache, /*end=*/false);
  EXPECT_FALSE(cache.cached(forward.ops.add, 2));
  EXPECT_FALSE(cache.cached(forward.ops.div, 0));
  for (int i = 0; i < 2; ++i) {
    const auto served = cache.take(forward.ops.mul, 0, false);
    EXPECT_TRUE(served.outputs[0].toTensor().is_alias_of(forward.product));
  }
  EXPECT_EQ(cache.kept_calls(), 2u);
  cache.prefetch();         // nothing while filling
  cache.release_untaken();  // nor this
  EXPECT_EQ(cache.kept_calls(), 2u);
  cache.end_forward();
  EXPECT_TRUE(cache.cached(forward.ops.mul, 0));
}

TEST(OpCache, DemotesAKeptCallModifiedInPlaceBeforeTheForwardEnds) {
  OpCache cache;
  Filled forward(cache, /*end=*/false);
  const Ops& ops = forward.ops;
  forward.sum.add_(1);
  cache.note_writes(ops.add_, {forward.sum});
  // Modified already: a recomputation now would rerun it.
  EXPECT_FALSE(cache.cached(ops.add, 1));
  cache.end_forward();
  ASSERT_EQ(cache.demotions().size(), 1u);
  const OpCache::Demotion& demotion = cache.demotions()[0];
  EXPECT_EQ(demotion.op, ops.add.operator_name());
  EXPECT_EQ(demotion.call_index, 1u);
  ASSERT_TRUE(demotion.writer.has_value());
  EXPECT_EQ(*demotion.writer, ops.add_.operator_name());
  EXPECT_EQ(cache.demoted_calls(), 1u);
  EXPECT_FALSE(cache.cached(ops.add, 1));
  EXPECT_EQ(cache.kept_calls(), 1u);
  EXPECT_EQ(cache.bytes(), bytes_of(forward.product));
  EXPECT_EQ(cache.summary().recompute_calls, 2u);
}

TEST(OpCache, RefusesAnOutputModifiedAfterTheForwardUnlessAllowed) {
  OpCache cache;
  Filled forward(cache);
  forward.product.mul_(3);
  const std::string modified = error_of([&] { cache.take(forward.ops.mul, 0, false); });
  EXPECT_NE(modified.find("a tensor cached for aten::mul.Tensor (call 0, tensor 0) was "
                          "modified in place after the checkpointed forward (version 0 when "
                          "cached, 1 now)"),
            std::string::npos)
      << modified;
  EXPECT_EQ(cache.kept_calls(), 2u);  // refused: nothing taken
  const auto served = cache.take(forward.ops.mul, 0, /*allow_mutation=*/true);
  EXPECT_TRUE(torch::equal(served.outputs[0].toTensor(), forward.product));
}

// An output aliased by a tensor with a counter of its own (aten::_unsafe_view
// makes one), modified through it: the cache watches every tensor the
// forward passes on a kept storage.
TEST(OpCache, SeesAChangeThroughAnAliasWithACounterOfItsOwn) {
  OpCache cache;
  Filled forward(cache, /*end=*/false);
  at::Tensor alias = forward.sum.variable_data();
  cache.watch_aliases({alias});
  alias.add_(1);
  cache.end_forward();
  ASSERT_EQ(cache.demotions().size(), 1u);
  EXPECT_EQ(cache.demotions()[0].op, forward.ops.add.operator_name());
  EXPECT_FALSE(cache.demotions()[0].writer.has_value());  // no write noted
}

TEST(OpCache, ClearLeavesItAsNew) {
  OpCache cache;
  Filled forward(cache, /*end=*/false);
  forward.sum.add_(1);
  cache.end_forward();
  ASSERT_EQ(cache.demotions().size(), 1u);
  cache.clear();
  EXPECT_TRUE(cache.empty());
  EXPECT_TRUE(cache.demotions().empty());
  EXPECT_EQ(cache.kept_calls(), 0u);
  EXPECT_EQ(cache.bytes(), 0u);
  EXPECT_EQ(cache.calls_so_far(forward.ops.add), 0u);
  EXPECT_EQ(cache.collectives().size(), 0u);
  const OpCache::Summary summary = cache.summary();
  EXPECT_EQ(summary.saved_calls + summary.recompute_calls + summary.offloaded_calls, 0u);
  // And fills again.
  Filled again(cache);
  EXPECT_EQ(cache.kept_calls(), 2u);
  EXPECT_TRUE(cache.demotions().empty());
}

// With producers tracked, a call's answer changes until the forward ends.
TEST(OpCache, LateDecisionsKeepAndRecomputeCallsUntilTheForwardEnds) {
  const Ops ops;
  OpCache cache;
  cache.begin_forward(/*track_producers=*/true);
  const at::Tensor out = torch::randn({6});
  cache.append_recompute(ops.mul, {out});
  const auto producer = cache.producer_of(out.view({2, 3}));  // a view finds it too
  ASSERT_TRUE(producer.has_value());
  EXPECT_EQ(producer->op, ops.mul);
  EXPECT_EQ(producer->call_index, 0u);
  EXPECT_FALSE(producer->kept);
  EXPECT_FALSE(cache.producer_of(torch::randn({6})).has_value());

  EXPECT_FALSE(cache.keep_late(*producer, nullptr).has_value());
  EXPECT_EQ(cache.kept_calls(), 1u);
  EXPECT_EQ(cache.bytes(), bytes_of(out));
  EXPECT_TRUE(cache.producer_of(out)->kept);
  EXPECT_TRUE(cache.cached(ops.mul, 0));

  cache.recompute_late(*cache.producer_of(out));
  EXPECT_EQ(cache.kept_calls(), 0u);
  EXPECT_EQ(cache.bytes(), 0u);
  EXPECT_FALSE(cache.cached(ops.mul, 0));

  // An output freed before the decision: the cache held the latest call's
  // outputs only, and the next call replaced them.
  at::Tensor freed = torch::randn({3});
  cache.append_recompute(ops.add, {freed});
  const auto gone = cache.producer_of(freed);
  ASSERT_TRUE(gone.has_value());
  cache.append_recompute(ops.mul, {torch::randn({3})});
  freed.reset();
  const auto why = cache.keep_late(*gone, nullptr);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("was freed already"), std::string::npos) << *why;
  EXPECT_EQ(cache.kept_calls(), 0u);

  cache.end_forward();
  EXPECT_EQ(cache.summary().recompute_calls, 3u);
  EXPECT_FALSE(cache.producer_of(out).has_value());  // tracking ended
}

}  // namespace cache_op_cache_test
