// sac sharded_train: parameters sharded over the ranks and all-gathered
// inside each checkpointed block (the FSDP pattern), against the same model
// replicated on every rank (data parallel), on c10d.
//
// Each block is x + gelu(layer_norm(x) W1) W2, with W1 and W2 flattened into
// one parameter. Sharded, a rank holds 1/N of it and all-gathers the whole
// inside the block's checkpointed region; backward reduce-scatters the
// gradient (examples/c10d_support.h, AllGather). Replicated, every rank holds
// all of it and the gradients are all-reduced (GradientAllReduce).
//
// For each way of running, every rank prints the bytes of parameters it
// holds, the activation bytes it keeps after the forward, the peak during
// forward and backward, the collectives the regions issued in forward and
// in recomputation (counted by the process group), and whether its gradients
// are bit-identical to the replicated, uncheckpointed run's.
//
//   examples/launch_ranks.sh 2 build/examples/sharded_train [--blocks 4]
//       [--width 256] [--rows 512]
//
// The modes:
//   replicated / sharded          no checkpointing
//   replicated+dots               dots_saveable: the matmuls' outputs kept
//   sharded+keep_gathered         never_recompute_collectives + dots: the
//                                 all-gather's output (the whole weight) is
//                                 kept, never gathered again
//   sharded+regather              dots_saveable only: the all-gather is
//                                 recomputed, FSDP's reshard after forward
//   sharded+full                  nothing_saveable
//   sharded+region                a sac::CheckpointRegion around each block
//   sharded+region+dots           (its gather included), without and with
//                                 dots_saveable: backward replays the gather
//                                 from the shard, after the ranks agree on
//                                 what they replay (one small all-gather per
//                                 region, counted in the recomputation's
//                                 collectives). Under the fallback mechanism
//                                 only (--dispatch fallback, or
//                                 SAC_DISPATCH=fallback).
#include <sac/sac.h>
#include <sac/policy/presets.h>

#include "examples/c10d_support.h"
#include "examples/gpt_flags.h"
#include "examples/memory_meter.h"

#include <absl/flags/flag.h>
#include <torch/torch.h>

#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

ABSL_FLAG(int64_t, blocks, 4, "blocks");
ABSL_FLAG(int64_t, width, 256, "block width (the world size must divide 8 * width^2)");
ABSL_FLAG(int64_t, rows, 512, "rows of input per rank");
ABSL_FLAG(std::string, dispatch, "default",
          "sac's dispatch mechanism: per_op, fallback or default");

namespace {

namespace dist = sac_examples::dist;
constexpr auto kTimeout = std::chrono::seconds(120);

struct Sizes {
  int64_t blocks, width, rows;
};

// One block, given its whole flat parameter.
at::Tensor block(const at::Tensor& x, const at::Tensor& flat, int64_t width) {
  const at::Tensor w1 = flat.narrow(0, 0, width * 4 * width).view({width, 4 * width});
  const at::Tensor w2 =
      flat.narrow(0, width * 4 * width, 4 * width * width).view({4 * width, width});
  const at::Tensor h = torch::layer_norm(x, {width});
  return x + torch::mm(torch::gelu(torch::mm(h, w1)), w2);
}

struct Mode {
  std::string name;
  bool sharded;
  std::optional<sac::Policy> policy;  // none: no checkpointing
  bool region = false;                // a sac::CheckpointRegion per block (with `policy` if any)
};

struct Result {
  int64_t param_bytes = 0, kept = 0, peak = 0, forward_collectives = 0, recompute_collectives = 0;
  std::vector<at::Tensor> grads;  // each block's, this rank's slice
};

Result train_step(const Mode& mode, const Sizes& s, const dist::Group& fwd, const dist::Group& bwd,
                  sac_examples::MemoryMeter& memory) {
  const int rank = fwd.rank, world = fwd.world;
  const int64_t numel = 8 * s.width * s.width;
  torch::manual_seed(0);
  std::vector<at::Tensor> params;
  for (int64_t b = 0; b < s.blocks; ++b) {
    at::Tensor full = torch::randn({numel}) / std::sqrt(static_cast<double>(s.width));
    params.push_back((mode.sharded ? full.chunk(world)[rank].clone() : full).requires_grad_());
  }
  torch::manual_seed(100 + rank);
  const at::Tensor x = torch::randn({s.rows, s.width});
  const at::Tensor target = torch::randn({s.rows, s.width});

  std::optional<dist::GradientAllReduce> reducer;
  if (!mode.sharded) reducer.emplace(params, bwd, /*bucket_bytes=*/numel * 4);
  const auto region = [&](const at::Tensor& h, const at::Tensor& p) {
    const at::Tensor flat = mode.sharded ? dist::AllGather::apply(p, &fwd, &bwd) : p;
    return block(h, flat, s.width);
  };

  Result r;
  for (const auto& p : params) r.param_bytes += static_cast<int64_t>(p.nbytes());
  const int64_t before = memory.live();
  memory.reset_peak();
  const int64_t issued = fwd.issued();
  at::Tensor h = x;
  for (const auto& p : params) {
    if (mode.region) {
      sac::CheckpointOptions options;
      if (mode.policy) options.policy(*mode.policy);
      sac::CheckpointRegion checkpointed(options);
      h = region(h, p);
    } else {
      h = mode.policy ? sac::checkpoint(sac::CheckpointOptions().policy(*mode.policy), region, h, p)
                      : region(h, p);
    }
  }
  at::Tensor loss = torch::mse_loss(h, target);
  r.kept = memory.live() - before;
  r.forward_collectives = fwd.issued() - issued;
  loss.backward();
  if (reducer) reducer->finish();
  r.peak = memory.peak() - before;
  r.recompute_collectives = fwd.issued() - issued - r.forward_collectives;
  for (const auto& p : params) {
    r.grads.push_back(mode.sharded ? p.grad() : p.grad().chunk(world)[rank]);
  }
  return r;
}

int run(int argc, char** argv) {
  sac_examples::parse_flags(argc, argv);
  sac_examples::choose_dispatch(absl::GetFlag(FLAGS_dispatch));
  const Sizes s{absl::GetFlag(FLAGS_blocks), absl::GetFlag(FLAGS_width), absl::GetFlag(FLAGS_rows)};
  if (s.blocks <= 0 || s.width <= 0 || s.rows <= 0) {
    throw std::invalid_argument("--blocks, --width and --rows must be positive");
  }
  const dist::Rendezvous rz = dist::rendezvous_from_env(kTimeout);
  if ((8 * s.width * s.width) % rz.world != 0) {
    throw std::invalid_argument("the world size must divide 8 * width^2");
  }
  const dist::Group fwd = dist::make_group(rz, "fwd", kTimeout);
  const dist::Group bwd = dist::make_group(rz, "bwd", kTimeout);
  torch::set_num_threads(1);
  sac_examples::MemoryMeter memory(torch::Device(torch::kCPU));

  std::vector<Mode> modes = {
      {"replicated", false, std::nullopt},
      {"replicated+dots", false, sac::dots_saveable()},
      {"sharded", true, std::nullopt},
      {"sharded+keep_gathered", true,
       sac::any_of({sac::dots_saveable(), sac::never_recompute_collectives()})},
      {"sharded+regather", true, sac::dots_saveable()},
      {"sharded+full", true, sac::nothing_saveable()},
  };
  if (sac::dispatch::mechanism() == sac::dispatch::Mechanism::FallbackKey) {
    modes.push_back({"sharded+region", true, std::nullopt, /*region=*/true});
    modes.push_back({"sharded+region+dots", true, sac::dots_saveable(), /*region=*/true});
  }
  std::printf("rank %d of %d: %lld blocks of width %lld, %lld rows per rank\n", rz.rank, rz.world,
              static_cast<long long>(s.blocks), static_cast<long long>(s.width),
              static_cast<long long>(s.rows));
  std::printf("%-22s %12s %12s %12s %10s %10s  %s\n", "mode", "params MiB", "live MiB", "peak MiB",
              "coll. fwd", "coll. rec.", "grads = replicated");
  std::vector<at::Tensor> reference;
  bool all_equal = true;
  for (const Mode& mode : modes) {
    const Result r = train_step(mode, s, fwd, bwd, memory);
    if (reference.empty()) reference = r.grads;
    bool equal = true;
    for (size_t i = 0; i < reference.size(); ++i)
      equal = equal && torch::equal(reference[i], r.grads[i]);
    all_equal = all_equal && equal;
    std::printf("%-22s %12.3f %12.3f %12.3f %10lld %10lld  %s\n", mode.name.c_str(),
                r.param_bytes / 1048576.0, r.kept / 1048576.0, r.peak / 1048576.0,
                static_cast<long long>(r.forward_collectives),
                static_cast<long long>(r.recompute_collectives),
                equal ? "bit-identical" : "DIFFER");
    std::fflush(stdout);
  }
  return all_equal ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return sac_examples::main_reporting_errors("sharded_train", run, argc, argv);
}
