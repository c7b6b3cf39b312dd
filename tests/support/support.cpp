#include "support.h"

#include <cstdlib>

namespace sac_test {

void expect_configured_mechanism() {
  const char* env = std::getenv("SAC_DISPATCH");
  const std::string name = env == nullptr ? "auto" : env;
  const auto mechanism = sac::dispatch::mechanism();
  if (name == "per_op") {
    EXPECT_EQ(mechanism, sac::dispatch::Mechanism::PerOpKernels);
  } else if (name == "fallback") {
    EXPECT_EQ(mechanism, sac::dispatch::Mechanism::FallbackKey);
  }
}

std::vector<at::Tensor> run_and_grad(const std::function<at::Tensor()>& forward,
                                     const std::vector<at::Tensor>& inputs,
                                     const std::vector<at::Tensor>& params, uint64_t seed) {
  torch::manual_seed(seed);
  at::Tensor out = forward();
  std::vector<at::Tensor> wrt = inputs;
  wrt.insert(wrt.end(), params.begin(), params.end());
  auto grads = torch::autograd::grad({out.sum()}, wrt);
  std::vector<at::Tensor> result{out.detach()};
  result.insert(result.end(), grads.begin(), grads.end());
  return result;
}

void expect_bit_identical(const std::vector<at::Tensor>& expected,
                          const std::vector<at::Tensor>& actual) {
  ASSERT_EQ(expected.size(), actual.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_TRUE(expected[i].defined()) << "expected tensor " << i << " undefined";
    ASSERT_TRUE(actual[i].defined()) << "tensor " << i << " undefined";
    EXPECT_EQ(expected[i].sizes(), actual[i].sizes()) << "tensor " << i;
    EXPECT_EQ(expected[i].dtype(), actual[i].dtype()) << "tensor " << i;
    EXPECT_TRUE(torch::equal(expected[i], actual[i]))
        << "tensor " << i << " differs; max abs difference "
        << (expected[i] - actual[i]).abs().max().item<double>();
  }
}

}  // namespace sac_test
