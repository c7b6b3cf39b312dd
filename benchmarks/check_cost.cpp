// check_cost: what sac's checks cost a training step, by model size.
//
//   check_cost [--runs N] [--threads T]
//   (SAC_DISPATCH picks the mechanism)
//
// 1. DeterminismCheck::Values beside the default check. Each model's blocks
//    are checkpointed one by one with sac::checkpoint, under full
//    recomputation and under dots_saveable. Models: the 4-block MLP of issue
//    35 (width 64, batch 32), and examples/gpt.h's GPT at three widths (4
//    layers, seq 128, batch 8, dropout 0.1).
// 2. The outside-tensor check, on beside off, on the MLP with its residual
//    added in place (an in-place op: under per-op kernels its reads come
//    through a RecordFunction callback), at widths 16, 64 and 256.
//
// The two settings alternate step by step, so that a machine whose speed
// drifts (a shared VM) slows both alike; each row gives the median step of
// each and their ratio.
#include "examples/gpt.h"

#include <sac/sac.h>
#include <sac/policy/presets.h>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace {

struct MlpBlockImpl : torch::nn::Module {
  explicit MlpBlockImpl(int64_t width) {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
    up = register_module("up", torch::nn::Linear(width, 4 * width));
    down = register_module("down", torch::nn::Linear(4 * width, width));
  }
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor h = down->forward(torch::gelu(up->forward(norm->forward(x))));
    return in_place ? h.add_(x) : x + h;
  }
  bool in_place = false;
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear up{nullptr}, down{nullptr};
};
TORCH_MODULE(MlpBlock);

// One training step's forward and backward; its blocks checkpointed with
// `options`.
using Step = std::function<void(const sac::CheckpointOptions& options)>;

struct Model {
  std::string name;
  double parameter_mib;
  Step step;
};

Model mlp(int64_t width = 64, bool in_place = false) {
  auto blocks = std::make_shared<std::vector<MlpBlock>>();
  for (int i = 0; i < 4; ++i) {
    blocks->push_back(MlpBlock(width));
    blocks->back()->in_place = in_place;
  }
  double bytes = 0;
  for (auto& b : *blocks) {
    for (const auto& p : b->parameters()) bytes += p.numel() * 4.0;
  }
  const at::Tensor x = torch::randn({32, width});
  return {"MLP 4 x " + std::to_string(width) + ", batch 32" +
              (in_place ? ", residual in place" : ""),
          bytes / (1 << 20), [blocks, x](const sac::CheckpointOptions& o) {
            at::Tensor h = x;
            for (const MlpBlock& block : *blocks) {
              std::shared_ptr<MlpBlockImpl> b = block.ptr();
              h = sac::checkpoint(
                  o, [b](const at::Tensor& in) { return b->forward(in); }, h);
            }
            h.square().sum().backward();
          }};
}

Model gpt(int64_t embed) {
  const sac_examples::Config config{4, embed, 4, 128, 8, 512, 1};
  auto model = std::make_shared<sac_examples::Gpt>(config);
  double bytes = 0;
  for (const auto& p : (*model)->parameters()) bytes += p.numel() * 4.0;
  const auto batch = sac_examples::synthetic_batch(config, torch::kCPU);
  return {"GPT 4 x " + std::to_string(embed) + ", seq 128, batch 8", bytes / (1 << 20),
          [model, batch](const sac::CheckpointOptions& o) {
            torch::manual_seed(42);
            at::Tensor h = (*model)->embed(batch.inputs);
            for (size_t i = 0; i < (*model)->blocks->size(); ++i) {
              auto block = (*model)->blocks->ptr<sac_examples::GptBlockImpl>(i);
              h = sac::checkpoint(
                  o, [block](const at::Tensor& in) { return block->forward(in); }, h);
            }
            sac_examples::GptImpl::loss_of((*model)->logits(h), batch.targets).backward();
          }};
}

double milliseconds(const Step& step, const sac::CheckpointOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  step(options);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// The median step under `a` and under `b`, steps alternating after one
// warm-up step of each.
std::pair<double, double> alternate(const Step& step, int runs, const sac::CheckpointOptions& a,
                                    const sac::CheckpointOptions& b) {
  milliseconds(step, a);
  milliseconds(step, b);
  std::vector<double> times_a, times_b;
  for (int run = 0; run < runs; ++run) {
    times_a.push_back(milliseconds(step, a));
    times_b.push_back(milliseconds(step, b));
  }
  return {median(times_a), median(times_b)};
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 15;
  int threads = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--runs") == 0) {
      runs = std::atoi(argv[i + 1]);
    } else if (std::strcmp(argv[i], "--threads") == 0) {
      threads = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "usage: check_cost [--runs N] [--threads T]\n");
      return 2;
    }
  }
  at::set_num_threads(threads);
  torch::manual_seed(0);
  const std::string mechanism(sac::dispatch::to_string(sac::dispatch::mechanism()));
  std::printf("mechanism: %s, %d thread(s), %d steps of each check, alternating\n\n",
              mechanism.c_str(), threads, runs);
  std::printf("| model | parameters MiB | policy | default ms | values ms | values / default |\n");
  std::printf("| --- | ---: | --- | ---: | ---: | ---: |\n");
  const std::vector<std::pair<const char*, sac::Policy>> policies = {
      {"full recomputation", sac::nothing_saveable()}, {"dots_saveable", sac::dots_saveable()}};
  for (const Model& model : {mlp(), gpt(64), gpt(128), gpt(256)}) {
    for (const auto& [policy_name, policy] : policies) {
      const auto [plain, values] = alternate(
          model.step, runs, sac::CheckpointOptions().policy(policy),
          sac::CheckpointOptions().policy(policy).determinism_check(sac::DeterminismCheck::Values));
      std::printf("| %s | %.2f | %s | %.2f | %.2f | %.2fx |\n", model.name.c_str(),
                  model.parameter_mib, policy_name, plain, values, values / plain);
      std::fflush(stdout);
    }
  }
  std::printf("\n| model | outside-tensor check off ms | on ms | on / off |\n");
  std::printf("| --- | ---: | ---: | ---: |\n");
  for (const int64_t width : {16, 64, 256}) {
    const Model model = mlp(width, /*in_place=*/true);
    const auto [off, on] =
        alternate(model.step, runs, sac::CheckpointOptions().outside_tensor_check(false),
                  sac::CheckpointOptions());
    std::printf("| %s | %.2f | %.2f | %.2fx |\n", model.name.c_str(), off, on, on / off);
    std::fflush(stdout);
  }
  return 0;
}
