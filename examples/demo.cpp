// sac demo: a stack of GPT blocks trained on CPU under each checkpointing
// policy. For each, it reports the activation memory live after the forward,
// the peak during forward + backward (exact, from a counting CPU allocator),
// the time per training step, and whether the gradients are bit-identical to
// the un-checkpointed run.
//
//   demo [--blocks N] [--embed N] [--seq N] [--batch N] [--steps N]
#include <sac/sac.h>

#include "examples/support.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace {

using sac_examples::CountingAllocator;
using sac_examples::GptBlock;

struct Config {
  int64_t blocks = 4, embed = 128, heads = 4, seq = 128, batch = 8, steps = 3;
};

struct Mode {
  std::string name;
  bool checkpoint;
  std::optional<sac::Policy> policy;
};

std::vector<Mode> modes() {
  auto every_other = std::make_shared<int64_t>(0);
  return {
      {"no checkpoint", false, std::nullopt},
      {"full recompute", true, std::nullopt},
      {"save matmuls", true, sac::Policy::save_ops({"aten::addmm"})},
      {"save matmuls + attention", true,
       sac::Policy::save_ops({"aten::addmm", "aten::_scaled_dot_product_flash_attention_for_cpu"})},
      {"every other matmul (callback)", true,
       sac::Policy::from_fn([every_other](const sac::SelectiveCheckpointContext&,
                                          const c10::OperatorHandle& op,
                                          c10::ArrayRef<c10::IValue>) {
         return op.operator_name().name == "aten::addmm" && (*every_other)++ % 2 == 0;
       })},
  };
}

struct Model {
  explicit Model(const Config& c) {
    torch::manual_seed(0);
    for (int64_t i = 0; i < c.blocks; ++i) {
      blocks.emplace_back(c.embed, c.heads, /*dropout=*/0.1);
    }
  }
  at::Tensor forward(const at::Tensor& x, const Mode& mode) {
    at::Tensor h = x;
    for (auto& block : blocks) {
      auto run = [block](const at::Tensor& in) mutable { return block->forward(in); };
      if (!mode.checkpoint) {
        h = run(h);
      } else {
        sac::CheckpointOptions options;
        if (mode.policy) {
          options.policy(*mode.policy);
        }
        h = sac::checkpoint(options, run, h);
      }
    }
    return h;
  }
  std::vector<at::Tensor> parameters() {
    std::vector<at::Tensor> out;
    for (auto& block : blocks) {
      for (auto& p : block->parameters()) out.push_back(p);
    }
    return out;
  }
  std::vector<GptBlock> blocks;
};

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

}  // namespace

int main(int argc, char** argv) {
  Config c;
  for (int i = 1; i + 1 < argc; i += 2) {
    const int64_t v = std::stoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--blocks")) c.blocks = v;
    else if (!std::strcmp(argv[i], "--embed")) c.embed = v;
    else if (!std::strcmp(argv[i], "--seq")) c.seq = v;
    else if (!std::strcmp(argv[i], "--batch")) c.batch = v;
    else if (!std::strcmp(argv[i], "--steps")) c.steps = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  CountingAllocator::install();
  torch::manual_seed(1);
  const at::Tensor x = torch::randn({c.batch, c.seq, c.embed});
  std::printf("sac demo: %lld GPT blocks, embed %lld, seq %lld, batch %lld; dispatch: %s\n\n",
              (long long)c.blocks, (long long)c.embed, (long long)c.seq, (long long)c.batch,
              std::string(sac::dispatch::to_string(sac::dispatch::mechanism())).c_str());
  std::printf("%-32s %14s %12s %10s  %s\n", "policy", "live after fwd", "peak", "ms/step",
              "gradients");

  std::vector<at::Tensor> reference;
  bool all_identical = true;
  for (const Mode& mode : modes()) {
    Model model(c);
    auto params = model.parameters();
    // One measured step: memory and gradients.
    torch::manual_seed(42);
    const int64_t before = CountingAllocator::live_bytes();
    CountingAllocator::reset_peak();
    at::Tensor loss = model.forward(x, mode).pow(2).mean();
    const int64_t kept = CountingAllocator::live_bytes() - before;
    auto grads = torch::autograd::grad({loss}, params);
    const int64_t peak = CountingAllocator::peak_bytes() - before;
    bool identical = true;
    if (reference.empty()) {
      reference = grads;
    } else {
      for (size_t i = 0; i < grads.size(); ++i) identical &= torch::equal(grads[i], reference[i]);
    }
    all_identical &= identical;
    grads.clear();
    loss.reset();
    // Timed training steps (SGD).
    torch::optim::SGD sgd(params, torch::optim::SGDOptions(1e-3));
    const auto start = std::chrono::steady_clock::now();
    for (int64_t step = 0; step < c.steps; ++step) {
      sgd.zero_grad();
      model.forward(x, mode).pow(2).mean().backward();
      sgd.step();
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count() /
        static_cast<double>(c.steps);
    std::printf("%-32s %10.2f MiB %8.2f MiB %10.1f  %s\n", mode.name.c_str(), mib(kept), mib(peak),
                ms, identical ? "bit-identical" : "DIFFERENT");
  }
  return all_identical ? 0 : 1;
}
