// The command line shared by examples/gpt_train and examples/policy_lab: the
// GPT's sizes as flags (Abseil), and a main() that reports errors. Include
// it in one translation unit of a program: it defines the flags.
#pragma once

#include "examples/gpt.h"

#include <sac/dispatch/mechanism.h>

#include <absl/flags/flag.h>
#include <absl/flags/parse.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

ABSL_FLAG(int64_t, layers, 4, "number of GPT blocks");
ABSL_FLAG(int64_t, embed, 128, "embedding width");
ABSL_FLAG(int64_t, heads, 4, "attention heads (must divide --embed)");
ABSL_FLAG(int64_t, seq, 128, "sequence length");
ABSL_FLAG(int64_t, batch, 8, "sequences per batch");
ABSL_FLAG(int64_t, vocab, 512, "vocabulary size");

namespace sac_examples {

// Parses the command line, which takes flags only.
inline void parse_flags(int argc, char** argv) {
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    throw std::invalid_argument(std::string("unexpected argument '") + positional[1] + "'");
  }
}

// The sizes from the flags, with `steps` training steps; `also_positive`
// are the program's own counts, checked with them.
inline Config config_from_flags(int64_t steps, std::vector<int64_t> also_positive = {}) {
  Config c{absl::GetFlag(FLAGS_layers),
           absl::GetFlag(FLAGS_embed),
           absl::GetFlag(FLAGS_heads),
           absl::GetFlag(FLAGS_seq),
           absl::GetFlag(FLAGS_batch),
           absl::GetFlag(FLAGS_vocab),
           steps};
  also_positive.insert(also_positive.end(),
                       {c.layers, c.embed, c.heads, c.seq, c.batch, c.vocab, c.steps});
  for (int64_t v : also_positive) {
    if (v <= 0) throw std::invalid_argument("every size and count flag must be positive");
  }
  if (c.embed % c.heads != 0) throw std::invalid_argument("--heads must divide --embed");
  return c;
}

// The device a --device flag names: cpu, or cuda (device 0) if available.
inline torch::Device device_named(const std::string& name) {
  if (name == "cpu") return torch::Device(torch::kCPU);
  if (name == "cuda") {
    if (!torch::cuda::is_available()) {
      throw std::invalid_argument("--device=cuda, but CUDA is not available to this LibTorch");
    }
    // The modes' losses and gradients are compared bit for bit: on CUDA that
    // needs deterministic kernels (cuBLAS reads its workspace setting when
    // its first handle is made, after this).
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
    return torch::Device(torch::kCUDA, 0);
  }
  throw std::invalid_argument("--device must be cpu or cuda, not '" + name + "'");
}

// Applies a --dispatch flag. sac chooses its dispatch mechanism once per
// process, on first use; so this runs before anything else touches sac.
// `default` leaves the choice to sac: SAC_DISPATCH, else automatic.
inline void choose_dispatch(const std::string& name) {
  if (name == "per_op") {
    sac::dispatch::set_mechanism(sac::dispatch::Mechanism::PerOpKernels);
  } else if (name == "fallback") {
    sac::dispatch::set_mechanism(sac::dispatch::Mechanism::FallbackKey);
  } else if (name != "default") {
    throw std::invalid_argument("--dispatch must be per_op, fallback or default, not '" + name +
                                "'");
  }
}

// Runs `program`: its exit status, or 2 with the error's message.
inline int main_reporting_errors(const char* name, int (*program)(int, char**), int argc,
                                 char** argv) {
  try {
    return program(argc, argv);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "\n%s: %s\n", name, e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\n%s: %s\n", name, e.what());
  }
  return 2;
}

}  // namespace sac_examples
