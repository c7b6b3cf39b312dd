// sac::CheckpointScope: default options for the sac::checkpoint calls and
// region guards of a block of code on one thread.
#include "support.h"

#include <sac/dispatch/internal/interceptor.h>

#include <thread>

namespace checkpoint_scope_test {

using sac_test::CountingAllocator;

// A policy that counts the forward calls it is asked about: a scope whose
// options a checkpoint used leaves a nonzero count.
struct CountingPolicy {
  std::shared_ptr<int> asked = std::make_shared<int>(0);
  sac::CheckpointOptions options() const {
    auto count = asked;
    return sac::CheckpointOptions().policy(
        sac::Policy::from_fn([count](const sac::SelectiveCheckpointContext&,
                                     const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue>) {
          ++*count;
          return op.operator_name().name == "aten::addmm";
        }));
  }
};

class Scope : public ::testing::Test {
 protected:
  void SetUp() override {
    sac_test::expect_configured_mechanism();
    CountingAllocator::install();
    torch::manual_seed(0);
    mlp = sac_test::Mlp(16, 32, 8, /*depth=*/3);
    x = torch::randn({4, 16}, torch::requires_grad());
  }
  at::Tensor checkpointed() {
    return sac::checkpoint([this](const at::Tensor& in) { return mlp->forward(in); }, x);
  }

  sac_test::Mlp mlp{nullptr};
  at::Tensor x;
};

TEST_F(Scope, CallsWithoutOptionsUseTheScopes) {
  CountingPolicy policy;
  const auto expected = sac_test::run_and_grad([&] { return mlp->forward(x); }, {x}, {});
  {
    sac::CheckpointScope scope(policy.options());
    const int64_t base = CountingAllocator::live_bytes();
    auto y = checkpointed();
    EXPECT_GT(*policy.asked, 0);
    // The scope's policy saves the three addmm outputs: exactly those stay.
    EXPECT_EQ(CountingAllocator::live_bytes() - base, (2 * 4 * 32 + 4 * 8) * 4);
    const auto actual = sac_test::run_and_grad([&] { return checkpointed(); }, {x}, {});
    sac_test::expect_bit_identical(expected, actual);
  }
  const int asked = *policy.asked;
  auto y = checkpointed();
  EXPECT_EQ(*policy.asked, asked) << "the scope ended";
}

TEST_F(Scope, OwnOptionsWinAndScopesNest) {
  CountingPolicy outer, inner, own;
  sac::CheckpointScope outer_scope(outer.options());
  {
    sac::CheckpointScope inner_scope(inner.options());
    checkpointed();
    sac::checkpoint(
        own.options(), [this](const at::Tensor& in) { return mlp->forward(in); }, x);
  }
  EXPECT_EQ(*outer.asked, 0);
  EXPECT_GT(*inner.asked, 0);
  EXPECT_GT(*own.asked, 0);
  checkpointed();
  EXPECT_GT(*outer.asked, 0) << "the outer scope is back";
}

TEST_F(Scope, AnExceptionLeavesNoScope) {
  CountingPolicy policy;
  EXPECT_THROW(
      {
        sac::CheckpointScope scope(policy.options());
        throw std::runtime_error("in the scope");
      },
      std::runtime_error);
  checkpointed();
  EXPECT_EQ(*policy.asked, 0);
}

TEST_F(Scope, ThreadLocal) {
  CountingPolicy policy;
  sac::CheckpointScope scope(policy.options());
  std::thread([&] { checkpointed(); }).join();
  EXPECT_EQ(*policy.asked, 0) << "another thread has no scope";
}

// A region guard made without options takes the scope's.
TEST_F(Scope, RegionsWithoutOptionsUseTheScopes) {
  if (!sac::detail::observers_see_every_op()) {
    GTEST_SKIP() << "sac::CheckpointRegion needs the fallback key";
  }
  CountingPolicy policy;
  sac::CheckpointScope scope(policy.options());
  at::Tensor y;
  {
    sac::CheckpointRegion region;
    y = mlp->forward(x);
  }
  EXPECT_GT(*policy.asked, 0);
  y.sum().backward();
}

}  // namespace checkpoint_scope_test
