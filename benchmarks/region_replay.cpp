// Replay (sac::CheckpointRegion) against function rerun (sac::checkpoint) on
// a GPT stack: forward and backward time, bytes live after the forward, and
// the peak during backward (a counting CPU allocator, exact).
//
//   SAC_DISPATCH=fallback build/benchmarks/region_replay [blocks] [repetitions]
//
// The configurations run in turn, one step each per round after a warm-up
// round, so that drift on a shared machine hits them alike; times are the
// minimum over rounds. The recomputation's own cost is the backward time
// minus the plain backward's.
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

// One step (forward, then backward of the mean square) of `mode`; keeps the
// minimum times in `result`.
void step(std::vector<sac_examples::GptBlock>& blocks, Mode mode,
          const sac::CheckpointOptions& options, int seed, Result& result) {
  torch::manual_seed(seed);
  auto x = torch::randn({kBatch, kSeq, kEmbed}, torch::requires_grad());
  const int64_t base = CountingAllocator::live_bytes();
  auto start = Clock::now();
  at::Tensor h = x;
  for (auto& block : blocks) {
    switch (mode) {
      case Mode::Plain: h = block->forward(h); break;
      case Mode::Rerun:
        h = sac::checkpoint(
            options, [&](const at::Tensor& in) { return block->forward(in); }, h);
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
  h.reset();
  CountingAllocator::reset_peak();
  const int64_t before = CountingAllocator::live_bytes();
  start = Clock::now();
  loss.backward();
  result.backward_ms = std::min(result.backward_ms, ms_since(start));
  result.backward_peak_bytes = CountingAllocator::peak_bytes() - before;
}

// Dispatch-bound: a chain of `kOps` multiplications of 1-element tensors,
// so that the time is sac's per-op work (recording, replaying) rather than
// the kernels'. Returns {forward, backward} ns per op, minimum over rounds.
constexpr int kOps = 2000;
std::pair<double, double> per_op_ns(Mode mode, int rounds) {
  auto w = torch::ones({1}, torch::requires_grad());
  auto chain = [&](const at::Tensor& x) {
    at::Tensor h = x;
    for (int i = 0; i < kOps; ++i) {
      h = h * w;
    }
    return h;
  };
  double forward = 1e30, backward = 1e30;
  for (int round = 0; round <= rounds; ++round) {
    auto x = torch::ones({1}, torch::requires_grad());
    auto start = Clock::now();
    at::Tensor y;
    switch (mode) {
      case Mode::Plain: y = chain(x); break;
      case Mode::Rerun: y = sac::checkpoint(chain, x); break;
      case Mode::Replay: {
        sac::CheckpointRegion region;
        y = chain(x);
        break;
      }
    }
    const double f = ms_since(start);
    start = Clock::now();
    y.backward();
    const double b = ms_since(start);
    if (round > 0) {
      forward = std::min(forward, f);
      backward = std::min(backward, b);
    }
  }
  return {forward * 1e6 / kOps, backward * 1e6 / kOps};
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
  struct Config {
    std::string policy, recomputation;
    Mode mode;
    sac::CheckpointOptions options;
    Result result;
  };
  const auto save_matmuls = sac::CheckpointOptions().policy(sac::Policy::save_ops({"aten::addmm"}));
  std::vector<Config> configs{
      {"-", "none (plain autograd)", Mode::Plain, {}, {}},
      {"recompute all", "function rerun", Mode::Rerun, {}, {}},
      {"recompute all", "replay (region guard)", Mode::Replay, {}, {}},
      {"save matmuls", "function rerun", Mode::Rerun, save_matmuls, {}},
      {"save matmuls", "replay (region guard)", Mode::Replay, save_matmuls, {}},
  };
  for (int round = 0; round <= repetitions; ++round) {
    for (auto& config : configs) {
      Result timed;
      step(blocks, config.mode, config.options, round, round == 0 ? timed : config.result);
    }
  }
  const double plain_backward = configs[0].result.backward_ms;
  std::printf("%-14s %-22s %10s %11s %12s %9s %18s\n", "policy", "recomputation", "forward ms",
              "backward ms", "recompute ms", "live MiB", "backward peak MiB");
  for (const auto& c : configs) {
    const Result& r = c.result;
    std::printf("%-14s %-22s %10.2f %11.2f %12s %9.2f %18.2f\n", c.policy.c_str(),
                c.recomputation.c_str(), r.forward_ms, r.backward_ms,
                c.mode == Mode::Plain
                    ? "-"
                    : std::to_string(r.backward_ms - plain_backward).substr(0, 6).c_str(),
                mib(r.kept_bytes), mib(r.backward_peak_bytes));
  }
  std::printf("\nper op, a chain of %d multiplications of 1-element tensors (dispatch-bound), "
              "full recomputation:\n%-22s %12s %13s\n",
              kOps, "recomputation", "forward ns", "backward ns");
  for (const auto& [name, mode] :
       {std::pair<const char*, Mode>{"none (plain autograd)", Mode::Plain},
        {"function rerun", Mode::Rerun},
        {"replay (region guard)", Mode::Replay}}) {
    const auto [forward, backward] = per_op_ns(mode, repetitions);
    std::printf("%-22s %12.0f %13.0f\n", name, forward, backward);
  }
  return 0;
}
