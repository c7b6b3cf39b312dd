// Built against the installed sac package; checks one selective checkpoint.
#include <sac/sac.h>

#include <torch/torch.h>

#include <iostream>

int main() {
  torch::manual_seed(0);
  auto w = torch::randn({16, 16}, torch::requires_grad());
  auto x = torch::randn({4, 16});
  auto f = [&](const torch::Tensor& in) { return torch::tanh(in.mm(w)).mm(w); };
  auto expected = torch::autograd::grad({f(x).sum()}, {w})[0];
  auto options = sac::CheckpointOptions().policy(sac::Policy::save_ops({"aten::mm"}));
  auto actual = torch::autograd::grad({sac::checkpoint(options, f, x).sum()}, {w})[0];
  const bool same = torch::equal(expected, actual);
  std::cout << "consumer: gradients " << (same ? "bit-identical" : "DIFFER") << "\n";
  return same ? 0 : 1;
}
