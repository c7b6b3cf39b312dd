// Shared helpers of sac's tests: models, gradients, exact memory counting.
#pragma once

#include <sac/sac.h>
#include <sac/checkpoint/guards.h>
#include <sac/lab.h>
#include <sac/policy/presets.h>

#include "examples/support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

namespace sac_test {

// The dispatch mechanism named by SAC_DISPATCH (ctest runs each test binary
// once per mechanism); checks that sac actually uses it.
void expect_configured_mechanism();

using sac_examples::CountingAllocator;
using sac_examples::GptBlock;
using sac_examples::Mlp;

// The counting allocator as a sac::MemoryProbe (sac/lab/peak.h), installed
// and with one intra-op thread: what the step-peak tests measure with.
inline sac::MemoryProbe counting_probe() {
  CountingAllocator::install();
  at::set_num_threads(1);
  return {[] { return CountingAllocator::live_bytes(); },
          [] { return CountingAllocator::peak_bytes(); }, [] { CountingAllocator::reset_peak(); }};
}

// A test of step peaks: the configured mechanism, and the counting
// allocator installed with one intra-op thread. Each file derives its own
// suite from it.
class CountingAllocatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    expect_configured_mechanism();
    counting_probe();
  }
};

// Seeds the CPU generator, runs `forward`, backpropagates its sum, and
// returns [output, d(sum)/d(inputs)..., d(sum)/d(params)...]. Grads are
// computed with torch::autograd::grad (nothing accumulates in .grad).
std::vector<at::Tensor> run_and_grad(const std::function<at::Tensor()>& forward,
                                     const std::vector<at::Tensor>& inputs,
                                     const std::vector<at::Tensor>& params, uint64_t seed = 1234);

// Each pair bit-identical (same shape, dtype, and every element equal).
void expect_bit_identical(const std::vector<at::Tensor>& expected,
                          const std::vector<at::Tensor>& actual);

// Runs `f`, expects it to throw a c10::Error (of type E), and returns its
// message without backtrace. Fails the test if nothing is thrown.
template <class E = c10::Error>
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what_without_backtrace();
  }
  ADD_FAILURE() << "expected an exception, none was thrown";
  return {};
}

}  // namespace sac_test
