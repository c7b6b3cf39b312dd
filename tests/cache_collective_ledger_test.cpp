// The ledger of a region's collectives (sac/cache/internal/collective_ledger.h) on its
// own: what makes two calls the same communication, and the errors. The
// collectives themselves, on two ranks, are in tests/distributed.
#include "support.h"

#include <sac/cache/internal/collective_ledger.h>
#include <sac/policy/internal/op_traits.h>

#include <ATen/core/dispatch/Dispatcher.h>

namespace cache_collective_ledger_test {

using sac_test::error_of;

c10::OperatorHandle op_named(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
}

std::vector<c10::IValue> all_reduce_args(const at::Tensor& t, const std::string& reduce,
                                         const std::string& group) {
  return {t, reduce, group};
}

TEST(CollectiveLedger, AcceptsTheForwardsCallsInOrderAndEarlyStopsShort) {
  const auto all_reduce = op_named("_c10d_functional::all_reduce");
  const auto all_gather = op_named("_c10d_functional::all_gather_into_tensor");
  sac::detail::CollectiveLedger ledger;
  ledger.note(all_reduce, all_reduce_args(torch::ones({2, 3}), "sum", "g"));
  ledger.note(all_gather, {torch::ones({4}), int64_t{2}, std::string("g")});
  ledger.note(all_reduce, all_reduce_args(torch::ones({5}), "max", "g"));
  EXPECT_EQ(ledger.size(), 3u);
  // Each op's calls are numbered on their own; a recomputation that stops
  // early checks a prefix.
  ledger.check(all_reduce, 0, all_reduce_args(torch::zeros({2, 3}), "sum", "g"));
  ledger.check(all_gather, 0, {torch::zeros({4}), int64_t{2}, std::string("g")});
  ledger.check(all_reduce, 1, all_reduce_args(torch::zeros({5}), "max", "g"));
  ledger.clear();
  EXPECT_EQ(ledger.size(), 0u);
}

TEST(CollectiveLedger, RefusesAnotherShapeDtypeReductionOrGroup) {
  const auto all_reduce = op_named("_c10d_functional::all_reduce");
  sac::detail::CollectiveLedger ledger;
  ledger.note(all_reduce, all_reduce_args(torch::ones({2, 3}), "sum", "g"));
  const auto refused = [&](const std::vector<c10::IValue>& args) {
    return error_of([&] { ledger.check(all_reduce, 0, args); });
  };
  const std::string shape = refused(all_reduce_args(torch::ones({3, 2}), "sum", "g"));
  EXPECT_NE(shape.find(
                "would issue collective _c10d_functional::all_reduce with (Float[3, 2], "
                "sum, g) as its call 1, but the forward issued it with (Float[2, 3], sum, g)"),
            std::string::npos)
      << shape;
  EXPECT_NE(refused(all_reduce_args(torch::ones({2, 3}, torch::kDouble), "sum", "g"))
                .find("(Double[2, 3], sum, g)"),
            std::string::npos);
  EXPECT_NE(refused(all_reduce_args(torch::ones({2, 3}), "max", "g")).find("(Float[2, 3], max, g)"),
            std::string::npos);
  EXPECT_NE(refused(all_reduce_args(torch::ones({2, 3}), "sum", "h")).find("(Float[2, 3], sum, h)"),
            std::string::npos);
}

TEST(CollectiveLedger, RefusesACallTheForwardNeverMade) {
  const auto all_reduce = op_named("_c10d_functional::all_reduce");
  const auto all_gather = op_named("_c10d_functional::all_gather_into_tensor");
  sac::detail::CollectiveLedger ledger;
  ledger.note(all_reduce, all_reduce_args(torch::ones({2}), "sum", "g"));
  const std::string extra =
      error_of([&] { ledger.check(all_reduce, 1, all_reduce_args(torch::ones({2}), "sum", "g")); });
  EXPECT_NE(extra.find("as its call 2, but the region's forward issued 1 such calls"),
            std::string::npos)
      << extra;
  EXPECT_NE(extra.find("sac::never_recompute_collectives()"), std::string::npos) << extra;
  const std::string never = error_of([&] {
    ledger.check(all_gather, 0, {torch::ones({2}), int64_t{2}, std::string("g")});
  });
  EXPECT_NE(never.find("_c10d_functional::all_gather_into_tensor (Float[2], 2, g) as its call 1, "
                       "but the region's forward issued 0 such calls"),
            std::string::npos)
      << never;
}

TEST(CollectiveLedger, OnlyCommunicatingFunctionalCollectivesAreTracked) {
  EXPECT_TRUE(sac::detail::issues_collective(op_named("_c10d_functional::all_reduce")));
  EXPECT_TRUE(sac::detail::issues_collective(op_named("_c10d_functional::all_reduce_")));
  EXPECT_TRUE(sac::detail::issues_collective(
      op_named("_c10d_functional_autograd::all_gather_into_tensor")));
  EXPECT_FALSE(sac::detail::issues_collective(op_named("_c10d_functional::wait_tensor")));
  EXPECT_FALSE(sac::detail::issues_collective(op_named("aten::mm")));
  EXPECT_TRUE(sac::detail::is_collective(op_named("_c10d_functional::wait_tensor")));
  EXPECT_TRUE(
      sac::detail::is_collective(op_named("_c10d_functional_autograd::reduce_scatter_tensor")));
}

}  // namespace cache_collective_ledger_test
