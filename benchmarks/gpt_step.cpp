// sac gpt_step: the step benchmark. Forward + backward of the GPT of
// examples/gpt_train under each checkpointing mode, with:
//   * the activation bytes live after the forward and the peak during forward
//     + backward, over what was live before (exact on the CPU: a counting
//     allocator; the caching allocator's statistics on CUDA);
//   * the step, forward and backward times: median, min and max of --runs
//     steps, the modes interleaved round-robin so that drift on a shared
//     machine hits every mode alike;
//   * the recomputation time (sac::RegionStatistics; policies only);
//   * whether each mode's gradients are bit-identical to `none`'s.
//
// Modes: none (no checkpointing); full (sac::checkpoint, no policy); and one
// per policy, each block a checkpoint: nothing_saveable, dots_saveable,
// compute_intensive_ops, everything_saveable (sac's presets) and
// matmuls_and_attention (examples/gpt.h).
//
// benchmarks/side_by_side.py runs it next to PyTorch's own SAC on the same
// model: it writes the weights and the batch (--weights) and reads back each
// mode's numbers (--csv) and first-step gradients (--grads).
//
//   build/benchmarks/gpt_step [--layers 4 --embed 128 ... as gpt_train]
//       [--modes none,full,...] [--runs 10] [--threads 1] [--dropout 0.1]
//       [--device cpu|cuda] [--autocast none|bf16] [--dispatch default|per_op|fallback]
//       [--weights FILE] [--grads DIR] [--csv FILE]
//
// Exit status 0 only if every mode's gradients are bit-identical to none's.
#include <sac/sac.h>
#include <sac/policy/presets.h>

#include "examples/gpt.h"
#include "examples/gpt_flags.h"
#include "examples/memory_meter.h"

#include <ATen/autocast_mode.h>
#include <absl/flags/flag.h>
#include <absl/flags/usage.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

const std::vector<std::string> kAllModes = {"none",
                                            "full",
                                            "nothing_saveable",
                                            "dots_saveable",
                                            "compute_intensive_ops",
                                            "matmuls_and_attention",
                                            "everything_saveable"};

}  // namespace

ABSL_FLAG(std::vector<std::string>, modes, kAllModes,
          "comma-separated modes (MODE+values: under the value check); `none`, the "
          "reference, always runs");
ABSL_FLAG(int64_t, runs, 10, "timed steps per mode (after one untimed warm-up step)");
ABSL_FLAG(int64_t, threads, 1, "intra-op threads (at::set_num_threads)");
ABSL_FLAG(double, dropout, 0.1, "dropout probability");
ABSL_FLAG(int64_t, seed, 42, "generator seed set before every step (the same dropout masks)");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda");
ABSL_FLAG(std::string, autocast, "none", "none, or bf16 (autocast on CUDA)");
ABSL_FLAG(std::string, dispatch, "default",
          "sac's dispatch mechanism: per_op, fallback, or default (SAC_DISPATCH, else automatic)");
ABSL_FLAG(std::string, weights, "",
          "a torch.save file of {'param.<name>': tensor, 'inputs', 'targets'}; "
          "default: seeded initialisation and examples/gpt.h's synthetic batch");
ABSL_FLAG(std::string, grads, "",
          "a folder to write each mode's first-step gradients to (<mode>.pt)");
ABSL_FLAG(std::string, csv, "", "a file to write the numbers to");

namespace {

using sac_examples::Batch;
using sac_examples::Config;
using sac_examples::Gpt;
using sac_examples::GptBlockImpl;
using sac_examples::MemoryMeter;

// ---- Modes -------------------------------------------------------------------

struct Mode {
  std::string name;
  std::optional<sac::CheckpointOptions> options;      // none: no checkpointing
  std::shared_ptr<sac::RegionStatistics> statistics;  // policies only
};

Mode mode_named(const std::string& name) {
  // MODE+values: MODE under DeterminismCheck::Values (the value check).
  const std::string suffix = "+values";
  if (name.size() > suffix.size() &&
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
    Mode mode = mode_named(name.substr(0, name.size() - suffix.size()));
    TORCH_CHECK(mode.options.has_value(), "gpt_step: ", name,
                ": `none` checkpoints nothing to check");
    mode.name = name;
    mode.options->determinism_check(sac::DeterminismCheck::Values);
    return mode;
  }
  if (name == "none") return {name, std::nullopt, nullptr};
  if (name == "full") return {name, sac::CheckpointOptions(), nullptr};
  std::optional<sac::Policy> policy;
  if (name == "nothing_saveable") policy = sac::nothing_saveable();
  if (name == "dots_saveable") policy = sac::dots_saveable();
  if (name == "compute_intensive_ops") policy = sac::compute_intensive_ops();
  if (name == "matmuls_and_attention") policy = sac_examples::save_matmuls_and_attention();
  if (name == "everything_saveable") policy = sac::everything_saveable();
  if (!policy) {
    std::string valid;
    for (const auto& m : kAllModes) valid += (valid.empty() ? "" : ", ") + m;
    throw std::invalid_argument("unknown mode '" + name + "'; valid modes: " + valid);
  }
  auto statistics = std::make_shared<sac::RegionStatistics>();
  return {name, sac::CheckpointOptions().policy(*policy).statistics(statistics), statistics};
}

std::vector<Mode> chosen_modes() {
  const auto names = absl::GetFlag(FLAGS_modes);
  std::vector<Mode> modes;
  if (std::find(names.begin(), names.end(), "none") == names.end())
    modes.push_back(mode_named("none"));
  for (const auto& name : names) modes.push_back(mode_named(name));
  return modes;
}

// ---- One step ----------------------------------------------------------------

struct Sample {
  int64_t kept_bytes = 0;
  int64_t peak_bytes = 0;
  double forward_ms = 0, backward_ms = 0, step_ms = 0;
  double recompute_ms = NAN;  // NaN: not counted (no policy)
};

void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// Autocast to bfloat16 on CUDA while alive, if asked for.
class AutocastScope {
 public:
  explicit AutocastScope(bool enabled) : enabled_(enabled) {
    if (enabled_) {
      at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
      at::autocast::set_autocast_enabled(at::kCUDA, true);
    }
  }
  ~AutocastScope() {
    if (enabled_) {
      at::autocast::set_autocast_enabled(at::kCUDA, false);
      at::autocast::clear_cache();
    }
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool enabled_;
};

struct Setup {
  Config config;
  torch::Device device;
  bool autocast;
  int64_t seed;
};

// The forward, block by block: each block a checkpoint under the mode's
// options, as side_by_side.py writes it for torch.utils.checkpoint.
at::Tensor forward_loss(Gpt& model, const Batch& batch, const Mode& mode, const Setup& setup) {
  AutocastScope autocast(setup.autocast);
  at::Tensor h = model->embed(batch.inputs);
  for (size_t i = 0; i < model->blocks->size(); ++i) {
    std::shared_ptr<GptBlockImpl> block = model->blocks->ptr<GptBlockImpl>(i);
    if (mode.options) {
      h = sac::checkpoint(
          *mode.options, [block](const at::Tensor& x) { return block->forward(x); }, h);
    } else {
      h = block->forward(h);
    }
  }
  return sac_examples::GptImpl::loss_of(model->logits(h), batch.targets);
}

Sample step(Gpt& model, const Batch& batch, const Mode& mode, const Setup& setup,
            MemoryMeter& memory) {
  for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
  torch::manual_seed(static_cast<uint64_t>(setup.seed));
  if (mode.statistics) mode.statistics->reset();
  synchronize(setup.device);

  Sample s;
  const int64_t before = memory.live();
  memory.reset_peak();
  const auto start = std::chrono::steady_clock::now();
  at::Tensor loss = forward_loss(model, batch, mode, setup);
  synchronize(setup.device);
  s.forward_ms = ms_since(start);
  s.kept_bytes = memory.live() - before;
  const auto backward_start = std::chrono::steady_clock::now();
  loss.backward();
  synchronize(setup.device);
  s.backward_ms = ms_since(backward_start);
  s.step_ms = ms_since(start);
  s.peak_bytes = memory.peak() - before;
  if (mode.statistics) s.recompute_ms = mode.statistics->read().recompute_seconds * 1e3;
  return s;
}

using Gradients = std::vector<std::pair<std::string, at::Tensor>>;

Gradients gradients_of(Gpt& model) {
  Gradients out;
  for (const auto& p : model->named_parameters())
    out.emplace_back(p.key(), p.value().grad().clone());
  return out;
}

bool identical(const Gradients& a, const Gradients& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].first != b[i].first || a[i].second.defined() != b[i].second.defined()) return false;
    if (a[i].second.defined() && !torch::equal(a[i].second, b[i].second)) return false;
  }
  return true;
}

// ---- Files -------------------------------------------------------------------

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument("cannot read --weights file '" + path + "'");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Copies the weights and the batch that side_by_side.py wrote into `model`
// and `batch`. Every parameter must be there with its shape, and nothing else.
void load_weights(const std::string& path, Gpt& model, Batch& batch, const torch::Device& device) {
  const c10::IValue file = torch::pickle_load(read_file(path));
  TORCH_CHECK(file.isGenericDict(), "--weights '", path,
              "' must hold a dict (torch.save of {'param.<name>': tensor, 'inputs', 'targets'})");
  const auto dict = file.toGenericDict();
  auto tensor_at = [&](const std::string& key) {
    const auto found = dict.find(key);
    TORCH_CHECK(found != dict.end(), "--weights '", path, "' has no entry '", key,
                "': were the weights written for a model of these sizes?");
    return found->value().toTensor();
  };
  torch::NoGradGuard no_grad;
  int64_t used = 0;
  for (auto& p : model->named_parameters()) {
    const at::Tensor value = tensor_at("param." + p.key());
    TORCH_CHECK(value.sizes() == p.value().sizes(), "--weights: '", p.key(), "' has shape ",
                value.sizes(), ", the model's is ", p.value().sizes(),
                ". Pass the same size flags to both sides.");
    p.value().copy_(value);
    ++used;
  }
  batch.inputs = tensor_at("inputs").to(device);
  batch.targets = tensor_at("targets").to(device);
  TORCH_CHECK(static_cast<int64_t>(dict.size()) == used + 2, "--weights '", path, "' has ",
              dict.size() - used - 2, " entries the model does not have");
}

void write_gradients(const std::string& folder, const std::string& mode, const Gradients& grads) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, grad] : grads) dict.insert(name, grad.cpu());
  const std::vector<char> bytes = torch::pickle_save(dict);
  const std::string path = folder + "/" + mode + ".pt";
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write '" + path + "'");
}

// ---- Report ------------------------------------------------------------------

struct Stats {
  double median, min, max;
};

Stats stats_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  const double median = n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
  return {median, values.front(), values.back()};
}

template <class Field>
Stats stats_of(const std::vector<Sample>& samples, Field field) {
  std::vector<double> values;
  for (const Sample& s : samples) values.push_back(s.*field);
  return stats_of(values);
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

int run_all(int argc, char** argv) {
  absl::SetProgramUsageMessage("times forward + backward of a GPT under each checkpointing mode");
  sac_examples::parse_flags(argc, argv);
  const int64_t runs = absl::GetFlag(FLAGS_runs);
  Config config =
      sac_examples::config_from_flags(/*steps=*/1, {runs, absl::GetFlag(FLAGS_threads)});
  config.dropout = absl::GetFlag(FLAGS_dropout);
  const std::string autocast = absl::GetFlag(FLAGS_autocast);
  if (autocast != "none" && autocast != "bf16") {
    throw std::invalid_argument("--autocast must be none or bf16, not '" + autocast + "'");
  }
  const Setup setup{config, sac_examples::device_named(absl::GetFlag(FLAGS_device)),
                    autocast == "bf16", absl::GetFlag(FLAGS_seed)};
  if (setup.autocast && !setup.device.is_cuda()) {
    throw std::invalid_argument("--autocast=bf16 is for --device=cuda");
  }
  at::set_num_threads(static_cast<int>(absl::GetFlag(FLAGS_threads)));
  sac_examples::choose_dispatch(absl::GetFlag(FLAGS_dispatch));
  const std::vector<Mode> modes = chosen_modes();

  MemoryMeter memory(setup.device);
  torch::manual_seed(0);
  Gpt model(config);
  model->to(setup.device);
  Batch batch = sac_examples::synthetic_batch(config, setup.device);
  if (!absl::GetFlag(FLAGS_weights).empty()) {
    load_weights(absl::GetFlag(FLAGS_weights), model, batch, setup.device);
  }
  std::printf(
      "sac gpt_step: %lld layers, embed %lld, %lld heads, seq %lld, batch %lld, vocab %lld, "
      "dropout %.2f, on %s%s, %d thread(s); dispatch: %s; %lld timed steps per mode\n",
      (long long)config.layers, (long long)config.embed, (long long)config.heads,
      (long long)config.seq, (long long)config.batch, (long long)config.vocab, config.dropout,
      setup.device.str().c_str(), setup.autocast ? " (autocast bf16)" : "", at::get_num_threads(),
      std::string(sac::dispatch::to_string(sac::dispatch::mechanism())).c_str(), (long long)runs);

  // A warm-up step per mode gives its gradients (compared below) and pays
  // one-time costs (kernels registered for a policy) outside the timing.
  std::vector<Gradients> first(modes.size());
  std::vector<std::vector<Sample>> samples(modes.size());
  for (size_t m = 0; m < modes.size(); ++m) {
    step(model, batch, modes[m], setup, memory);
    first[m] = gradients_of(model);
  }
  for (int64_t r = 0; r < runs; ++r) {
    for (size_t m = 0; m < modes.size(); ++m) {
      samples[m].push_back(step(model, batch, modes[m], setup, memory));
    }
  }

  std::FILE* csv = nullptr;
  if (!absl::GetFlag(FLAGS_csv).empty()) {
    csv = std::fopen(absl::GetFlag(FLAGS_csv).c_str(), "w");
    if (csv == nullptr)
      throw std::runtime_error("cannot write --csv '" + absl::GetFlag(FLAGS_csv) + "'");
    std::fprintf(csv,
                 "mode,kept_bytes,peak_bytes,step_ms_median,step_ms_min,step_ms_max,"
                 "forward_ms_median,backward_ms_median,recompute_ms_median,identical_to_none\n");
  }
  std::printf("\n%-22s | %9s | %9s | %27s | %7s | %7s | %9s | %s\n", "mode", "live MiB", "peak MiB",
              "step ms: median [min, max]", "fwd ms", "bwd ms", "recomp ms", "grads = none");
  bool all_identical = true;
  for (size_t m = 0; m < modes.size(); ++m) {
    const bool same = identical(first[m], first[0]);
    all_identical = all_identical && same;
    // Bytes are the same every step (the counting allocator is exact); the
    // first timed step's are reported.
    const Sample& s = samples[m].front();
    const Stats step_ms = stats_of(samples[m], &Sample::step_ms);
    const Stats fwd = stats_of(samples[m], &Sample::forward_ms);
    const Stats bwd = stats_of(samples[m], &Sample::backward_ms);
    const Stats recompute = stats_of(samples[m], &Sample::recompute_ms);
    std::printf("%-22s | %9.3f | %9.3f | %9.2f [%7.2f, %7.2f] | %7.2f | %7.2f | %9.2f | %s\n",
                modes[m].name.c_str(), mib(s.kept_bytes), mib(s.peak_bytes), step_ms.median,
                step_ms.min, step_ms.max, fwd.median, bwd.median, recompute.median,
                same ? "yes" : "NO");
    if (csv) {
      std::fprintf(csv, "%s,%lld,%lld,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%d\n", modes[m].name.c_str(),
                   (long long)s.kept_bytes, (long long)s.peak_bytes, step_ms.median, step_ms.min,
                   step_ms.max, fwd.median, bwd.median, recompute.median, same ? 1 : 0);
    }
    if (!absl::GetFlag(FLAGS_grads).empty()) {
      write_gradients(absl::GetFlag(FLAGS_grads), modes[m].name, first[m]);
    }
  }
  if (csv) std::fclose(csv);
  if (!all_identical) {
    std::printf("\nNOT every mode's gradients are bit-identical to none's\n");
    return 1;
  }
  std::printf("\nall %zu modes: gradients bit-identical to none\n", modes.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return sac_examples::main_reporting_errors("gpt_step", run_all, argc, argv);
}
