// Under per-op kernels sac registers intercepting kernels lazily, for the ops
// the policies made so far need, and keeps them for the life of the process.
// A region whose forward ran before a later policy added kernels must still
// recompute correctly (issue 5, repro 5: it failed with "aten::exp ran during
// recomputation but never in the checkpointed forward").
//
// This needs a process in which no kernel was registered yet: these tests
// live in their own binary, run in file order, and turn the outside-tensor
// check off (it would register every cacheable op at the first checkpoint).
// Under the fallback key they run too, and must give the same gradients.
#include "support.h"

#include <atomic>

namespace dispatch_late_registration_test {

class LateRegistration : public ::testing::Test {
 protected:
  void SetUp() override { sac_test::expect_configured_mechanism(); }
};

sac::CheckpointOptions saving(const std::vector<std::string>& ops) {
  return sac::CheckpointOptions().policy(sac::Policy::save_ops(ops)).outside_tensor_check(false);
}

TEST_F(LateRegistration, TwoRegionsWithDifferentPoliciesInOneStep) {
  torch::manual_seed(0);
  auto x = torch::randn({6, 6}, torch::requires_grad());
  auto f = [](const at::Tensor& a) { return a.mm(a).exp(); };
  const auto expected = torch::autograd::grad({f(x).sum() + f(x).sum()}, {x})[0];
  auto y1 = sac::checkpoint(saving({"aten::mm"}), f, x);
  auto y2 = sac::checkpoint(saving({"aten::exp"}), f, x);  // adds exp's kernel
  const auto g = torch::autograd::grad({y1.sum() + y2.sum()}, {x})[0];
  EXPECT_TRUE(torch::equal(g, expected));
}

TEST_F(LateRegistration, CallbackPolicyCreatedAfterARegionRan) {
  torch::manual_seed(0);
  auto x = torch::randn({6, 6}, torch::requires_grad());
  auto f = [](const at::Tensor& a) { return a.mm(a).sigmoid().mm(a).log_softmax(1); };
  const auto expected = torch::autograd::grad({f(x).sum()}, {x})[0];
  auto y = sac::checkpoint(saving({"aten::mm"}), f, x);
  // A callback made now intercepts every cacheable op under per-op kernels.
  std::atomic<int> asked{0};
  auto later = sac::Policy::from_fn([&](const sac::SelectiveCheckpointContext&,
                                        const c10::OperatorHandle&, c10::ArrayRef<c10::IValue>) {
    ++asked;
    return false;
  });
  auto z =
      sac::checkpoint(sac::CheckpointOptions().policy(later).outside_tensor_check(false), f, x);
  const auto g = torch::autograd::grad({y.sum()}, {x})[0];
  EXPECT_TRUE(torch::equal(g, expected));
  const auto gz = torch::autograd::grad({z.sum()}, {x})[0];
  EXPECT_TRUE(torch::equal(gz, expected));
  EXPECT_GT(asked.load(), 0);
}

}  // namespace dispatch_late_registration_test
