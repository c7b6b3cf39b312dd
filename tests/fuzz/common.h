// sac_fuzz's shared settings and helpers: constants, the save_ops
// candidates, seeds, and string helpers (Note [The fuzzer's files] in fuzz.cpp).
#pragma once

#include <sac/sac.h>
#include <sac/policy/presets.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

extern char** environ;

namespace {

constexpr int kIterations = 3;
constexpr double kLearningRate = 0.01;
// A child that reports no result for this long is hung (SAC_FUZZ_TIMEOUT
// overrides it).
int child_timeout_s() {
  const char* env = std::getenv("SAC_FUZZ_TIMEOUT");
  return env ? std::atoi(env) : 120;
}
constexpr size_t kChunkSize = 100;
// Failures re-run alone to see whether they need earlier cases; beyond this
// many, a run full of failures would spend its time starting processes.
constexpr size_t kMaxRechecks = 50;

// Candidate op names for save_ops policies. Those save_ops rejects (composite,
// views, unknown in this LibTorch) are dropped when the process starts.
const char* const kSaveOpCandidates[] = {
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::_unsafe_view",
    "aten::exp",
    "aten::sin",
    "aten::tanh",
    "aten::sigmoid",
    "aten::_softmax",
    "aten::_log_softmax",
    "aten::native_layer_norm",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::gelu",
    "aten::native_dropout",
    "aten::mul.Tensor",
    "aten::add.Tensor",
    "aten::sum.dim_IntList",
    "aten::max.dim",
    "aten::sort",
    "aten::gather",
    "aten::index_select",
    "aten::_to_copy",
    "aten::clone",
    "aten::pow.Tensor_Scalar",
    "aten::relu",
    "aten::linear",  // composite: expected to be rejected
};

struct SaveOpNames {
  std::vector<std::string> accepted;
  std::vector<std::pair<std::string, std::string>> dropped;  // name, reason
};

const SaveOpNames& save_op_names() {
  static const SaveOpNames names = [] {
    SaveOpNames out;
    for (const char* name : kSaveOpCandidates) {
      try {
        (void)sac::Policy::save_ops({name});
        out.accepted.emplace_back(name);
      } catch (const c10::Error& e) {
        std::string reason = e.what_without_backtrace();
        reason = reason.substr(0, reason.find('\n'));
        out.dropped.emplace_back(name, reason);
      }
    }
    return out;
  }();
  return names;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t case_seed(uint64_t base, uint64_t index) {
  return splitmix64(base * 0x100000001B3ull + index);
}

// Stable across builds, unlike std::hash.
uint64_t fnv1a(const std::string& s, uint64_t salt) {
  uint64_t h = 1469598103934665603ull ^ salt;
  for (unsigned char c : s) {
    h = (h ^ c) * 1099511628211ull;
  }
  return h;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    s += (i ? "," : "") + std::to_string(shape[i]);
  }
  return s + "]";
}

std::string first_lines(const std::string& text, size_t max_lines) {
  std::string out;
  size_t lines = 0, pos = 0;
  while (pos < text.size() && lines < max_lines) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    out += (lines ? "\n" : "") + text.substr(pos, end - pos);
    pos = end + 1;
    ++lines;
  }
  if (pos < text.size()) out += "\n[... truncated]";
  return out;
}

}  // namespace
