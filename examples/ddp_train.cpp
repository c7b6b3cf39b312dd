// sac ddp_train: the GPT of examples/gpt_train, trained data-parallel on
// several processes with c10d, selective activation checkpointing on every
// block.
//
// Each rank holds the whole model and trains on its own batch; the gradients
// are averaged over the ranks by bucketed all-reduces that autograd hooks
// start while backward still runs (examples/c10d_support.h,
// GradientAllReduce), so every rank takes the same optimizer step. Every
// rank prints, for each step, its own loss and the mean over the ranks (the
// same on every rank), the activation bytes it keeps after its forward, and
// at the end whether its parameters are bit-identical to rank 0's.
//
//   examples/launch_ranks.sh 2 build/examples/ddp_train [--steps 3]
//       [--policy matmuls+attention|full|none] [--bucket_kb 1024]
//       [--layers 4] [--embed 128] [--heads 4] [--seq 128] [--batch 8] [--vocab 512]
//
// --batch is per rank. Across machines, start one process per rank with
// RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set as torchrun sets them.
// Gloo on CPU; see examples/c10d_support.h for NCCL.
#include <sac/nn/apply_activation_checkpointing.h>
#include <sac/sac.h>
#include <sac/policy/presets.h>

#include "examples/c10d_support.h"
#include "examples/gpt.h"
#include "examples/gpt_flags.h"
#include "examples/memory_meter.h"

#include <absl/flags/flag.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

ABSL_FLAG(int64_t, steps, 3, "training steps");
ABSL_FLAG(std::string, policy, "matmuls+attention",
          "checkpointing of each block: matmuls+attention (selective), full, or none");
ABSL_FLAG(int64_t, bucket_kb, 1024, "gradient all-reduce bucket size, KiB");
ABSL_FLAG(std::string, dispatch, "default",
          "sac's dispatch mechanism: per_op, fallback or default");

namespace {

namespace dist = sac_examples::dist;
using sac_examples::Batch;
using sac_examples::Config;
using sac_examples::Gpt;

constexpr auto kTimeout = std::chrono::seconds(120);

// This rank's batch: the rank's own random tokens.
Batch rank_batch(const Config& c, int rank) {
  torch::manual_seed(1000 + rank);
  const auto ids = torch::randint(c.vocab, {c.batch, c.seq + 1});
  using torch::indexing::Slice;
  return {ids.index({Slice(), Slice(0, -1)}),
          ids.index({Slice(), Slice(1, torch::indexing::None)})};
}

void checkpoint_blocks(Gpt& model, const std::string& policy,
                       const std::shared_ptr<sac::RegionStatistics>& stats) {
  if (policy == "none") return;
  auto options = sac::CheckpointOptions();
  if (policy == "matmuls+attention") {
    options
        .policy(sac::any_of(
            {sac_examples::save_matmuls_and_attention(), sac::never_recompute_collectives()}))
        .statistics(stats);
  } else if (policy != "full") {
    throw std::invalid_argument("--policy must be matmuls+attention, full or none, not '" + policy +
                                "'");
  }
  sac::apply_activation_checkpointing(model->blocks,
                                      sac::modules_of_type<sac_examples::GptBlockImpl>(), options);
}

// Rank 0's parameters, on every rank.
std::vector<at::Tensor> broadcast_from_rank0(const std::vector<at::Tensor>& params,
                                             const dist::Group& group) {
  std::vector<at::Tensor> copies;
  for (const auto& p : params) copies.push_back(p.detach().clone());
  for (auto& c : copies) {
    std::vector<at::Tensor> one = {c};
    group.pg->broadcast(one)->wait();
  }
  return copies;
}

int run(int argc, char** argv) {
  sac_examples::parse_flags(argc, argv);
  sac_examples::choose_dispatch(absl::GetFlag(FLAGS_dispatch));
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  const Config c = sac_examples::config_from_flags(steps, {absl::GetFlag(FLAGS_bucket_kb)});

  const dist::Rendezvous rz = dist::rendezvous_from_env(kTimeout);
  const dist::Group group = dist::make_group(rz, "ddp", kTimeout);
  torch::set_num_threads(1);
  sac_examples::MemoryMeter memory(torch::Device(torch::kCPU));

  // The same initial weights on every rank: DDP broadcasts rank 0's.
  torch::manual_seed(0);
  Gpt model(c);
  {
    torch::NoGradGuard no_grad;
    const auto params = model->parameters();
    const auto rank0 = broadcast_from_rank0(params, group);
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(rank0[i]);
  }
  auto stats = std::make_shared<sac::RegionStatistics>();
  checkpoint_blocks(model, absl::GetFlag(FLAGS_policy), stats);
  dist::GradientAllReduce reducer(model->parameters(), group,
                                  absl::GetFlag(FLAGS_bucket_kb) * 1024);
  torch::optim::AdamW optimizer(model->parameters());
  const Batch batch = rank_batch(c, rz.rank);
  torch::manual_seed(42 + rz.rank);  // dropout masks: each rank its own

  std::printf("rank %d of %d: GPT %lld layers, embed %lld, batch %lld per rank, policy %s, "
              "%lld gradient buckets\n",
              rz.rank, rz.world, static_cast<long long>(c.layers), static_cast<long long>(c.embed),
              static_cast<long long>(c.batch), absl::GetFlag(FLAGS_policy).c_str(),
              static_cast<long long>(reducer.buckets()));
  for (int64_t step = 0; step < steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    stats->reset();
    optimizer.zero_grad();
    const int64_t before = memory.live();
    memory.reset_peak();
    const int64_t issued_before = group.issued();
    at::Tensor loss = model->loss(batch.inputs, batch.targets);
    const int64_t kept = memory.live() - before;
    loss.backward();
    reducer.finish();
    const int64_t peak = memory.peak() - before;
    const int64_t gradient_allreduces = group.issued() - issued_before;
    optimizer.step();
    at::Tensor mean;
    {
      torch::NoGradGuard no_grad;
      mean = dist::wait_tensor(dist::all_reduce(loss.detach(), "sum", group.name)) / rz.world;
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    const sac::RegionStatistics::Counts counts = stats->read();
    std::printf("step %lld: loss %.6f, mean over ranks %.9f | activations kept %.3f MiB, "
                "peak %.3f MiB | all-reduces %lld | collectives in regions: %zu forward, %zu "
                "recomputation | %.0f ms\n",
                static_cast<long long>(step), loss.item<double>(), mean.item<double>(),
                kept / 1048576.0, peak / 1048576.0, static_cast<long long>(gradient_allreduces),
                counts.collectives_issued, counts.collectives_reissued, ms);
    std::fflush(stdout);
  }

  const auto params = model->parameters();
  const auto rank0 = broadcast_from_rank0(params, group);
  bool identical = true;
  for (size_t i = 0; i < params.size(); ++i)
    identical = identical && torch::equal(params[i], rank0[i]);
  std::printf("parameters bit-identical to rank 0's: %s\n", identical ? "yes" : "NO");
  return identical ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return sac_examples::main_reporting_errors("ddp_train", run, argc, argv);
}
