// What sac believes an op does (sac/dispatch/internal/op_facts.h): its
// reads and writes, declared or not, its aliases, its draws and its
// communication, asked of real ops' schemas.
#include "support.h"

#include <sac/dispatch/internal/op_facts.h>

#include <string>
#include <vector>

namespace dispatch_op_facts_test {

c10::OperatorHandle op_of(const char* name, const char* overload = "") {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

// The index of `op`'s argument called `name`.
size_t argument(const c10::OperatorHandle& op, const std::string& name) {
  const auto& arguments = op.schema().arguments();
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (arguments[i].name() == name) return i;
  }
  ADD_FAILURE() << c10::toString(op.operator_name()) << " has no argument " << name;
  return 0;
}

TEST(OpFacts, InPlaceOpsWriteWhatTheyReadAndFillsOverwrite) {
  const auto add_ = op_of("aten::add_", "Tensor");
  EXPECT_TRUE(sac::detail::writes_argument(add_, 0, {}));
  EXPECT_TRUE(sac::detail::reads_argument(add_, 0));
  EXPECT_FALSE(sac::detail::overwrites_argument(add_, 0));
  EXPECT_FALSE(sac::detail::writes_argument(add_, 1, {}));
  EXPECT_TRUE(sac::detail::declares_a_write(add_));
  for (const char* fill : {"aten::copy_", "aten::bernoulli_"}) {
    const auto op = op_of(fill, std::string(fill) == "aten::copy_" ? "" : "float");
    EXPECT_TRUE(sac::detail::overwrites_argument(op, 0)) << fill;
    EXPECT_FALSE(sac::detail::reads_argument(op, 0)) << fill;
  }
  EXPECT_TRUE(sac::detail::is_random(op_of("aten::bernoulli_", "float")));
  EXPECT_FALSE(sac::detail::is_random(add_));
}

TEST(OpFacts, AnOutArgumentIsWrittenNotRead) {
  const auto mul_out = op_of("aten::mul", "out");
  const size_t out = argument(mul_out, "out");
  EXPECT_TRUE(sac::detail::writes_argument(mul_out, out, {}));
  EXPECT_TRUE(sac::detail::overwrites_argument(mul_out, out));
  EXPECT_FALSE(sac::detail::reads_argument(mul_out, out));
  EXPECT_TRUE(sac::detail::reads_argument(mul_out, argument(mul_out, "self")));
  EXPECT_FALSE(sac::detail::declares_a_write(op_of("aten::mul", "Tensor")));
}

TEST(OpFacts, TheLegacyBatchNormWritesItsStatisticsInTrainingOnly) {
  const auto bn = op_of("aten::native_batch_norm");
  const size_t mean = argument(bn, "running_mean");
  ASSERT_EQ(argument(bn, "training"), 5u);
  const auto x = at::ones({2, 3});
  std::vector<c10::IValue> args{
      x, at::ones({3}), at::zeros({3}), at::zeros({3}), at::ones({3}), true, 0.1, 1e-5};
  EXPECT_TRUE(sac::detail::writes_argument(bn, mean, args));
  EXPECT_FALSE(bn.schema().arguments()[mean].alias_info() != nullptr);  // undeclared
  args[5] = false;
  EXPECT_FALSE(sac::detail::writes_argument(bn, mean, args));
}

TEST(OpFacts, ViewsAliasAndReadNothing) {
  const auto view = op_of("aten::view");
  EXPECT_TRUE(sac::detail::is_view(view));
  EXPECT_TRUE(sac::detail::only_aliases(view));
  EXPECT_FALSE(sac::detail::reads_argument(view, 0));
  const auto add_ = op_of("aten::add_", "Tensor");  // aliases self, but writes it
  EXPECT_FALSE(sac::detail::is_view(add_));
  EXPECT_FALSE(sac::detail::only_aliases(add_));
  EXPECT_FALSE(sac::detail::is_view(op_of("aten::mm")));
  EXPECT_TRUE(sac::detail::makes_uninitialized_memory(op_of("aten::empty", "memory_format")));
  EXPECT_FALSE(sac::detail::makes_uninitialized_memory(op_of("aten::zeros")));
}

TEST(OpFacts, CollectivesCommunicateAndSomeWriteWhatNoSchemaSays) {
  const auto all_reduce = op_of("_c10d_functional::all_reduce");
  const auto wait = op_of("_c10d_functional::wait_tensor");
  EXPECT_TRUE(sac::detail::is_collective(all_reduce));
  EXPECT_TRUE(sac::detail::issues_collective(all_reduce));
  EXPECT_TRUE(sac::detail::communicates(all_reduce));
  EXPECT_TRUE(sac::detail::is_collective(wait));
  EXPECT_FALSE(sac::detail::issues_collective(wait));
  EXPECT_FALSE(sac::detail::communicates(wait));
  EXPECT_FALSE(sac::detail::is_collective(op_of("aten::mm")));

  // c10d's ops on a ProcessGroup: their outputs are written whole, and
  // allreduce_ writes its `tensors` in place, though the schemas say neither.
  const auto gather = op_of("c10d::_allgather_base_");
  const size_t output = argument(gather, "output_tensor");
  EXPECT_EQ(gather.schema().arguments()[output].alias_info(), nullptr);
  EXPECT_TRUE(sac::detail::writes_argument_declared_or_not(gather, output, {}));
  EXPECT_FALSE(sac::detail::reads_argument(gather, output));
  const auto allreduce = op_of("c10d::allreduce_");
  const size_t tensors = argument(allreduce, "tensors");
  EXPECT_TRUE(sac::detail::writes_argument_declared_or_not(allreduce, tensors, {}));
  EXPECT_TRUE(sac::detail::reads_argument(allreduce, tensors));
  EXPECT_TRUE(sac::detail::communicates(allreduce));
  EXPECT_FALSE(sac::detail::issues_collective(allreduce));
}

}  // namespace dispatch_op_facts_test
