// sac gpt_train: a small GPT trained with AdamW under each checkpointing mode.
//
// It shows sac on a whole torch::nn model, wired in from outside: the model's
// code knows nothing of checkpointing; sac::apply_activation_checkpointing
// wraps its GPT blocks in place, with full recomputation or a selective
// policy. For each mode, it reports the activation memory live after the
// forward and the peak during forward + backward of the first step (exact on
// CPU, from a counting allocator; the caching allocator's statistics on
// CUDA), the time per step, and whether the losses of every step and the
// gradients of the first step are bit-identical to training without
// checkpointing. Dropout is on, so this also checks that recomputation
// replays the forward's random numbers. The offload modes keep what autograd
// saves (and, with a policy, the blocks' inputs and cached outputs) in host
// memory: the table counts what stays on the training device.
//
//   cmake --build build --target gpt_train
//   build/examples/gpt_train [--layers 4] [--embed 128] [--heads 4] [--seq 128]
//       [--batch 8] [--vocab 512] [--steps 3] [--device cpu|cuda]
//       [--dispatch default|per_op|fallback]
//       [--modes none,full,matmuls,matmuls+attention,callback,offload,matmuls+offload]
//
// or .ci/gpt_train with the same flags. Exit status 0 only if every mode is
// bit-identical to `none`.
#include <sac/nn/apply_activation_checkpointing.h>
#include <sac/sac.h>

#include "examples/gpt.h"
#include "examples/gpt_flags.h"
#include "examples/host_arena.h"
#include "examples/memory_meter.h"
#include "examples/support.h"

#include <absl/flags/flag.h>
#include <absl/flags/usage.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

const std::vector<std::string> kDefaultModes = {
    "none", "full", "matmuls", "matmuls+attention", "callback", "offload", "matmuls+offload"};

}  // namespace

ABSL_FLAG(int64_t, steps, 3, "training steps per mode");
ABSL_FLAG(std::vector<std::string>, modes, kDefaultModes,
          "comma-separated checkpointing modes; `none`, the reference, always runs first");
ABSL_FLAG(std::string, dispatch, "default",
          "sac's dispatch mechanism: per_op, fallback, or default (SAC_DISPATCH, else automatic)");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda");

namespace {

using sac_examples::Batch;
using sac_examples::Config;
using sac_examples::Gpt;
using sac_examples::GptBlockImpl;
using sac_examples::MemoryMeter;
using sac_examples::save_matmuls_and_attention;
using sac_examples::synthetic_batch;

// ---- Modes -------------------------------------------------------------------

// An object kept alive around each training step's forward and backward (a
// guard), or null.
using StepGuard = std::shared_ptr<void>;

// A way of training: how to set up a fresh model, and what to hold during
// each step.
struct Mode {
  std::string name;
  std::function<void(Gpt&, const Config&)> prepare;
  std::function<StepGuard(Gpt&)> step_guard;
};

// Wraps every block of `model`, in place, to run under `options`.
std::function<void(Gpt&, const Config&)> checkpoint_blocks(sac::CheckpointOptions options) {
  return [options](Gpt& model, const Config& c) {
    const int64_t wrapped = sac::apply_activation_checkpointing(
        model->blocks, sac::modules_of_type<GptBlockImpl>(), options);
    TORCH_CHECK(wrapped == c.layers, "wrapped ", wrapped, " blocks, expected ", c.layers);
  };
}

// A callback policy: saves every other matmul, recomputes the rest. The
// counter is shared by the policy's copies (sac::Policy shares its callback),
// and the recomputation replays the forward's decisions instead of asking
// again, so counting calls is safe.
sac::Policy every_other_matmul() {
  auto calls = std::make_shared<int64_t>(0);
  return sac::Policy::from_fn([calls](const sac::SelectiveCheckpointContext&,
                                      const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue>) {
    return op.operator_name().name == "aten::addmm" && (*calls)++ % 2 == 0;
  });
}

// Saved tensors to host memory. On CUDA that is pinned host memory; on the
// CPU, where the tensors are in host memory already, a separate arena stands
// in for it, so that the table shows what leaves the training device.
std::function<StepGuard(Gpt&)> offload_to(std::shared_ptr<sac::CopyTarget> target) {
  return [target](Gpt& model) {
    return std::make_shared<sac::OffloadGuard>(
        sac::OffloadOptions().leave_in_place(model->parameters()).target(target));
  };
}

std::vector<Mode> known_modes(const torch::Device& device) {
  auto no_setup = [](Gpt&, const Config&) {};
  auto no_guard = [](Gpt&) { return StepGuard(); };
  std::shared_ptr<sac::CopyTarget> host =
      device.is_cpu() ? std::make_shared<sac_examples::HostArena>() : sac::host_memory();
  using Options = sac::CheckpointOptions;
  return {
      {"none", no_setup, no_guard},
      {"full", checkpoint_blocks(Options()), no_guard},
      {"matmuls", checkpoint_blocks(Options().policy(sac::Policy::save_ops({"aten::addmm"}))),
       no_guard},
      {"matmuls+attention", checkpoint_blocks(Options().policy(save_matmuls_and_attention())),
       no_guard},
      {"callback", checkpoint_blocks(Options().policy(every_other_matmul())), no_guard},
      {"offload", no_setup, offload_to(host)},
      // The policy's cache goes to the host too, with the blocks' inputs.
      {"matmuls+offload",
       checkpoint_blocks(Options().policy(sac::Policy::save_ops({"aten::addmm"}))),
       offload_to(host)},
  };
}

// The modes named on the command line, `none` first: it is the reference the
// others are compared with.
std::vector<Mode> chosen_modes(const std::vector<std::string>& names, const torch::Device& device) {
  const std::vector<Mode> known = known_modes(device);
  auto find = [&](const std::string& name) -> const Mode& {
    for (const Mode& mode : known) {
      if (mode.name == name) return mode;
    }
    std::string valid;
    for (const Mode& mode : known) valid += (valid.empty() ? "" : ", ") + mode.name;
    throw std::invalid_argument("unknown mode '" + name + "'; valid modes: " + valid);
  };
  std::vector<Mode> modes;
  if (names.empty() || names.front() != "none") modes.push_back(find("none"));
  for (const std::string& name : names) modes.push_back(find(name));
  return modes;
}

// ---- Measuring ---------------------------------------------------------------

// What one mode's run produced.
struct Run {
  int64_t kept_bytes = 0;  // after the first forward, over what was live before
  int64_t peak_bytes = 0;  // during the first forward + backward, over the same
  double ms_per_step = 0;
  std::vector<at::Tensor> losses;                                   // every step
  std::vector<std::pair<std::string, at::Tensor>> first_gradients;  // by parameter name
};

std::vector<std::pair<std::string, at::Tensor>> named_gradients(Gpt& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : model->named_parameters()) out.emplace_back(p.key(), p.value().grad());
  return out;
}

void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// Trains a fresh model (the same initial weights for every mode) for
// `c.steps` steps, measuring memory on the first. Prints each step's loss.
Run train(const Mode& mode, const Config& c, const Batch& batch, const torch::Device& device,
          MemoryMeter& memory) {
  torch::manual_seed(0);
  Gpt model(c);
  model->to(device);
  mode.prepare(model, c);
  torch::optim::AdamW optimizer(model->parameters());
  // The same dropout masks in every mode.
  torch::manual_seed(42);

  Run run;
  double timed_ms = 0;
  for (int64_t step = 0; step < c.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    optimizer.zero_grad();
    {
      const StepGuard guard = mode.step_guard(model);
      const int64_t before = memory.live();
      memory.reset_peak();
      at::Tensor loss = model->loss(batch.inputs, batch.targets);
      if (step == 0) run.kept_bytes = memory.live() - before;
      loss.backward();
      if (step == 0) {
        run.peak_bytes = memory.peak() - before;
        run.first_gradients = named_gradients(model);
      }
      run.losses.push_back(loss.detach());
    }
    optimizer.step();
    synchronize(device);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    // The first step pays for one-time setup (optimizer state, kernels
    // registered for the policy): time it only when it is the only one.
    if (step > 0 || c.steps == 1) timed_ms += ms;
    std::printf(" %.4f", run.losses.back().item<double>());
    std::fflush(stdout);
  }
  run.ms_per_step = timed_ms / static_cast<double>(c.steps > 1 ? c.steps - 1 : 1);
  return run;
}

// Whether `run` matches `reference` bit for bit: every loss, every gradient
// of the first step, and the parameter names they belong to.
bool identical(const Run& run, const Run& reference) {
  if (run.losses.size() != reference.losses.size() ||
      run.first_gradients.size() != reference.first_gradients.size()) {
    return false;
  }
  for (size_t i = 0; i < run.losses.size(); ++i) {
    if (!torch::equal(run.losses[i], reference.losses[i])) return false;
  }
  for (size_t i = 0; i < run.first_gradients.size(); ++i) {
    const auto& [name, grad] = run.first_gradients[i];
    const auto& [ref_name, ref_grad] = reference.first_gradients[i];
    if (name != ref_name || grad.defined() != ref_grad.defined() ||
        (grad.defined() && !torch::equal(grad, ref_grad))) {
      return false;
    }
  }
  return true;
}

// ---- Report ------------------------------------------------------------------

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}

int run_all(int argc, char** argv) {
  absl::SetProgramUsageMessage("trains a small GPT under each sac checkpointing mode");
  sac_examples::parse_flags(argc, argv);
  const Config c = sac_examples::config_from_flags(absl::GetFlag(FLAGS_steps));
  const torch::Device device = sac_examples::device_named(absl::GetFlag(FLAGS_device));
  sac_examples::choose_dispatch(absl::GetFlag(FLAGS_dispatch));
  const std::vector<Mode> modes = chosen_modes(absl::GetFlag(FLAGS_modes), device);

  MemoryMeter memory(device);
  const Batch batch = synthetic_batch(c, device);
  std::printf(
      "sac gpt_train: %lld layers, embed %lld, %lld heads, seq %lld, batch %lld, vocab %lld, "
      "%lld steps, dropout %.1f, on %s; dispatch: %s\n",
      (long long)c.layers, (long long)c.embed, (long long)c.heads, (long long)c.seq,
      (long long)c.batch, (long long)c.vocab, (long long)c.steps, c.dropout, device.str().c_str(),
      std::string(sac::dispatch::to_string(sac::dispatch::mechanism())).c_str());

  std::vector<std::pair<const Mode*, Run>> runs;
  for (const Mode& mode : modes) {
    std::printf("%-18s losses:", mode.name.c_str());
    std::fflush(stdout);
    runs.emplace_back(&mode, train(mode, c, batch, device, memory));
    std::printf("\n");
  }

  std::printf("\n%-18s | %20s | %10s | %8s | %s\n", "mode", "live after fwd (MiB)", "peak (MiB)",
              "ms/step", "losses+grads identical");
  std::string different;
  for (const auto& [mode, run] : runs) {
    const bool same = identical(run, runs.front().second);
    if (!same) different += " " + mode->name;
    std::printf("%-18s | %20s | %10s | %8.1f | %s\n", mode->name.c_str(),
                mib(run.kept_bytes).c_str(), mib(run.peak_bytes).c_str(), run.ms_per_step,
                same ? "yes" : "NO");
  }
  if (!different.empty()) {
    std::printf("\nNOT bit-identical to none:%s\n", different.c_str());
    return 1;
  }
  std::printf("\nall %zu modes: losses and first-step gradients bit-identical to none\n",
              runs.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return sac_examples::main_reporting_errors("gpt_train", run_all, argc, argv);
}
