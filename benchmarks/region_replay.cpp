// Replay (sac::CheckpointRegion) against function rerun (sac::checkpoint) on
// a GPT stack: forward and backward time, bytes kept after the forward, and
// the peak during backward (a counting CPU allocator, exact).
//
//   SAC_DISPATCH=fallback build/benchmarks/region_replay [blocks] [repetitions]
//
// Times are the minimum over repetitions (this machine is noisy). The
// recomputation's own cost is the backward time minus the plain backward's.
#include <sac/sac.h>

#include "examples/support.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace {

using sac_examples::CountingAllocator;
using Clock = std::chrono::steady_clock;

constexpr int64_t kBatch = 4, kSeq = 128, kEmbed = 256, kHeads = 8;

struct Result {
  double forward_ms = 1e30, backward_ms = 1e30;
  int64_t kept_bytes = 0, backward_peak_bytes = 0;
};

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

enum class Mode { Plain, Rerun, Replay };

Result measure(std::vector<sac_examples::GptBlock>& blocks, Mode mode,
               const std::optional<sac::Policy>& policy, int repetitions) {
  sac::CheckpointOptions options;
  if (policy) {
    options.policy(*policy);
  }
  Result result;
  for (int rep = 0; rep < repetitions; ++rep) {
    torch::manual_seed(rep);
    auto x = torch::randn({kBatch, kSeq, kEmbed}, torch::requires_grad());
    const int64_t base = CountingAllocator::live_bytes();
    auto start = Clock::now();
    at::Tensor h = x;
    for (auto& block : blocks) {
      switch (mode) {
        case Mode::Plain:
          h = block->forward(h);
          break;
        case Mode::Rerun:
          h = sac::checkpoint(options, [&](const at::Tensor& in) { return block->forward(in); }, h);
          break;
        case Mode::Replay: {
          sac::CheckpointRegion region(options);
          h = block->forward(h);
          break;
        }
      }
    }
    auto loss = h.pow(2).mean();
    result.forward_ms = std::min(result.forward_ms, ms_since(start));
    result.kept_bytes = CountingAllocator::live_bytes() - base;
    h = {};
    CountingAllocator::reset_peak();
    const int64_t before = CountingAllocator::live_bytes();
    start = Clock::now();
    loss.backward();
    result.backward_ms = std::min(result.backward_ms, ms_since(start));
    result.backward_peak_bytes = CountingAllocator::peak_bytes() - before;
  }
  return result;
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

}  // namespace

int main(int argc, char** argv) {
  const int blocks_n = argc > 1 ? std::stoi(argv[1]) : 4;
  const int repetitions = argc > 2 ? std::stoi(argv[2]) : 5;
  CountingAllocator::install();
  torch::manual_seed(0);
  std::vector<sac_examples::GptBlock> blocks;
  for (int i = 0; i < blocks_n; ++i) {
    blocks.emplace_back(kEmbed, kHeads, /*dropout=*/0.1);
  }
  std::printf("GPT stack: %d blocks, batch %lld, sequence %lld, embedding %lld, %d threads; "
              "dispatch: %s\n",
              blocks_n, static_cast<long long>(kBatch), static_cast<long long>(kSeq),
              static_cast<long long>(kEmbed), at::get_num_threads(),
              std::string(sac::dispatch::to_string(sac::dispatch::mechanism())).c_str());
  const std::vector<std::pair<std::string, std::optional<sac::Policy>>> policies{
      {"recompute all", std::nullopt},
      {"save matmuls", sac::Policy::save_ops({"aten::addmm"})}};
  const Result plain = measure(blocks, Mode::Plain, std::nullopt, repetitions);
  std::printf("%-14s %-22s %10s %11s %11s %13s %16s\n", "policy", "recomputation", "forward ms",
              "backward ms", "recompute ms", "kept MiB", "backward peak MiB");
  std::printf("%-14s %-22s %10.2f %11.2f %11s %13.2f %16.2f\n", "-", "none (plain autograd)",
              plain.forward_ms, plain.backward_ms, "-", mib(plain.kept_bytes),
              mib(plain.backward_peak_bytes));
  for (const auto& [name, policy] : policies) {
    for (const Mode mode : {Mode::Rerun, Mode::Replay}) {
      const Result r = measure(blocks, mode, policy, repetitions);
      std::printf("%-14s %-22s %10.2f %11.2f %11.2f %13.2f %16.2f\n", name.c_str(),
                  mode == Mode::Rerun ? "function rerun" : "replay (region guard)", r.forward_ms,
                  r.backward_ms, r.backward_ms - plain.backward_ms, mib(r.kept_bytes),
                  mib(r.backward_peak_bytes));
    }
  }
  return 0;
}
