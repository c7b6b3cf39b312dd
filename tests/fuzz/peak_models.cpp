// sac_peak_models: the step-peak planner (sac/lab/peak.h) against models it
// has never seen.
//
// Each case is a random model generated from a 64-bit seed, from a
// vocabulary of image layers (conv, BatchNorm in training, pooling) and
// sequence layers (linear on 2-D and 3-D input, LayerNorm, attention through
// sdpa and written out by hand with a mask built in the forward, softmax),
// activations in place and not, chains of scalings, views, reshapes and
// transposes, dropout, residual adds in place, split into several regions of
// different sizes with plain code between them, trained in one of an
// ordinary loop's shapes (gradients set to none at the end, left, zeroed in
// place, an optimizer's state made, two micro-batches accumulated). Its
// step is measured once under full recomputation, never run plainly for the
// plan, then run under every region unchecked, random policies, random byte budgets' plans (mixing
// unchecked and checkpointed regions) and random peak budgets' plans, each
// measured by the counting allocator. Properties, per case:
//   1. every prediction equals the measured peak, to the byte;
//   2. a peak plan's measured peak is at most its budget;
//   3. a peak plan's recomputation never grows with its budget;
//   4. every step's loss and gradients are bit-identical to the plain step;
//   5. at or over the plain step's peak a peak plan checkpoints nothing, and
//      under it a plan that recomputes peaks lower;
//   6. a byte plan's checkpointed regions each keep fewer bytes than
//      unchecked, and its recomputation runs again exactly the calls it
//      predicts (before the stop, not kept: RegionStatistics' calls_rerun);
//   7. where a byte plan has at most 14 choices, its recomputation is the
//      least of every choice of kept calls and unchecked regions that fits
//      (tried one by one).
// A prediction the model refuses (documented in peak.h) is counted, not
// failed.
//
//   sac_peak_models [--cases N] [--seed S] [--replay SEED] [--blocks B] [--verbose]
//   --blocks 512 counts each allocation in blocks of 512 bytes, as CUDA's
//   caching allocator's allocated bytes do.
//   env: SAC_DISPATCH (per_op | fallback), SAC_PEAK_CASES (overrides --cases)
//
// The last line is "N passed, M failed"; exit status 1 if any case failed.
#include "examples/support.h"

#include <sac/sac.h>
#include <sac/policy/presets.h>
#include <sac/lab.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

using sac_examples::CountingAllocator;
using Rng = std::mt19937_64;

int64_t pick(Rng& rng, int64_t lo, int64_t hi) {  // in [lo, hi]
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}
bool chance(Rng& rng, double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }

// One layer of a model: its parameters and buffers, and what it does.
struct Layer {
  std::string name;
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> buffers;
  std::function<at::Tensor(const at::Tensor&)> apply;
};

at::Tensor param(std::vector<int64_t> sizes, double scale) {
  return (torch::randn(sizes) * scale).set_requires_grad(true);
}

// A random model over [B, C, H, W] images or [B, T, D] sequences.
// What the step does with gradients and an optimizer's state around its
// forward and backward: the shapes of an ordinary training loop.
enum class Loop {
  NoneAtEnd,      // gradients set to none at the step's end
  Left,           // set to none first, and left at the end
  ZeroedInPlace,  // zeroed in place first (zero_grad(set_to_none=false))
  Optimizer,      // set to none first; a momentum buffer made per parameter, which updates it
  Accumulated,    // set to none first; two micro-batches' gradients summed, left
};
constexpr int kLoops = 5;
const char* const kLoopNames[kLoops] = {"gradients none at the end", "gradients left",
                                        "gradients zeroed in place", "optimizer state made",
                                        "two micro-batches accumulated"};

struct Model {
  bool image = false;
  Loop loop = Loop::NoneAtEnd;
  // The step makes its batch (x * 1) and holds it to its end, past the
  // backward and the optimizer's state: a region's input that outlives
  // the region's frame (the predictor once took it for freed there).
  bool batch_in_step = false;
  std::vector<at::Tensor> initial;  // the parameters' first values
  std::vector<at::Tensor> state;    // the optimizer's, made by the step
  std::vector<Layer> layers;
  // Layers [begin, end) of each region; the others run plainly.
  std::vector<std::pair<size_t, size_t>> regions;
  at::Tensor x;
  std::string listing;

  std::vector<at::Tensor> params() const {
    std::vector<at::Tensor> out{x};
    for (const Layer& l : layers) {
      out.insert(out.end(), l.params.begin(), l.params.end());
    }
    return out;
  }
};

Layer scalings(Rng& rng) {
  const int64_t n = pick(rng, 1, 4);
  std::vector<double> factors;
  for (int64_t i = 0; i < n; ++i) {
    factors.push_back(0.5 + 0.25 * static_cast<double>(pick(rng, 0, 4)));
  }
  return {"scalings x" + std::to_string(n), {}, {}, [factors](const at::Tensor& h) {
            at::Tensor t = h;
            for (size_t i = 0; i < factors.size(); ++i) {
              t = i % 2 == 0 ? t * factors[i] : t / factors[i];
            }
            return t;
          }};
}

Layer activation(Rng& rng) {
  const int64_t kind = pick(rng, 0, 5);
  const bool in_place = chance(rng, 0.4);
  const char* names[] = {"relu", "gelu", "tanh", "sigmoid", "silu", "softmax"};
  std::string name = std::string(names[kind]) + (in_place && kind != 1 && kind < 4 ? "_" : "");
  return {name, {}, {}, [kind, in_place](const at::Tensor& h) {
            if (in_place && kind != 1 && kind < 4) {
              at::Tensor t = h * 1.0;  // a fresh tensor that nothing saved
              switch (kind) {
                case 0: return t.relu_();
                case 2: return t.tanh_();
                default: return t.sigmoid_();
              }
            }
            switch (kind) {
              case 0: return at::relu(h);
              case 1: return at::gelu(h);
              case 2: return at::tanh(h);
              case 3: return at::sigmoid(h);
              case 4: return at::silu(h);
              default: return at::softmax(h, -1);
            }
          }};
}

Layer dropout(Rng& rng) {
  const double p = 0.1 * static_cast<double>(pick(rng, 1, 4));
  return {"dropout", {}, {}, [p](const at::Tensor& h) { return at::dropout(h, p, true); }};
}

// Adds `inner` of h to h: out of place, or in place on inner's fresh output.
Layer residual(Layer inner, bool in_place) {
  auto f = inner.apply;
  inner.name = "residual(" + inner.name + (in_place ? ", add_)" : ")");
  inner.apply = [f, in_place](const at::Tensor& h) {
    at::Tensor r = f(h);
    if (in_place) {
      r = r * 1.0;
      return r.add_(h);
    }
    return r + h;
  };
  return inner;
}

// ---- Sequences: [B, T, D] ------------------------------------------------------

Layer linear(Rng& rng, int64_t d) {
  at::Tensor w = param({d, d}, 1.0 / std::sqrt(static_cast<double>(d)));
  at::Tensor b = param({d}, 0.1);
  const bool flat = chance(rng, 0.5);
  // On 3-D input, the path at::linear takes where it cannot fold the batch
  // (a non-contiguous input): aten::matmul, then the bias added in place, so
  // a kept matmul output is modified later in the forward. On 2-D input:
  // aten::addmm.
  return {flat ? "linear(2-D)" : "linear(3-D)", {w, b}, {}, [w, b, flat](const at::Tensor& h) {
            if (!flat) {
              return at::matmul(h, w.t()).add_(b);
            }
            return at::linear(h.reshape({-1, h.size(2)}), w, b).view(h.sizes());
          }};
}

Layer mlp(Rng& rng, int64_t d) {
  const int64_t hidden = d * pick(rng, 1, 4);
  at::Tensor w1 = param({hidden, d}, 1.0 / std::sqrt(static_cast<double>(d)));
  at::Tensor b1 = param({hidden}, 0.1);
  at::Tensor w2 = param({d, hidden}, 1.0 / std::sqrt(static_cast<double>(hidden)));
  at::Tensor b2 = param({d}, 0.1);
  return {"mlp x" + std::to_string(hidden / d), {w1, b1, w2, b2}, {}, [=](const at::Tensor& h) {
            at::Tensor flat = h.reshape({-1, h.size(2)});
            return at::linear(at::gelu(at::linear(flat, w1, b1)), w2, b2).view(h.sizes());
          }};
}

Layer layer_norm(int64_t d) {
  at::Tensor w = param({d}, 1.0) + 1.0;
  w = w.detach().set_requires_grad(true);
  at::Tensor b = param({d}, 0.1);
  return {"layer_norm", {w, b}, {}, [w, b, d](const at::Tensor& h) {
            return at::layer_norm(h, {d}, w, b);
          }};
}

Layer batch_norm_1d(int64_t d) {
  at::Tensor w = param({d}, 0.1);
  at::Tensor b = param({d}, 0.1);
  at::Tensor mean = torch::zeros({d}), var = torch::ones({d});
  return {"batch_norm(1-D)", {w, b}, {mean, var}, [=](const at::Tensor& h) {
            at::Tensor flat = h.reshape({-1, d});
            return at::batch_norm(flat, w, b, mean, var, true, 0.1, 1e-5, false).view(h.sizes());
          }};
}

// Attention: q, k, v from one projection; sdpa (causal, or with a mask made
// here) or written out (scores, a scale, a mask built in the forward,
// softmax, dropout, the product).
Layer attention(Rng& rng, int64_t d) {
  const int64_t heads = d % 2 == 0 && chance(rng, 0.5) ? 2 : 1;
  at::Tensor w = param({3 * d, d}, 1.0 / std::sqrt(static_cast<double>(d)));
  at::Tensor proj = param({d, d}, 1.0 / std::sqrt(static_cast<double>(d)));
  const int64_t kind = pick(rng, 0, 2);
  const double p = chance(rng, 0.5) ? 0.1 : 0.0;
  const char* names[] = {"attention(sdpa, causal)", "attention(sdpa, mask)", "attention(by hand)"};
  return {names[kind], {w, proj}, {}, [=](const at::Tensor& h) {
            const int64_t B = h.size(0), T = h.size(1);
            auto parts = at::linear(h, w).split(d, 2);
            auto split = [&](const at::Tensor& t) {
              return t.reshape({B, T, heads, d / heads}).transpose(1, 2);
            };
            at::Tensor q = split(parts[0]), k = split(parts[1]), v = split(parts[2]);
            at::Tensor out;
            if (kind == 0) {
              out = at::scaled_dot_product_attention(q, k, v, {}, 0.0, true);
            } else {
              at::Tensor mask = torch::ones({T, T}, torch::kBool).tril();
              if (kind == 1) {
                out = at::scaled_dot_product_attention(q, k, v, mask);
              } else {
                at::Tensor scores =
                    at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(d / heads));
                scores = scores.masked_fill(mask.logical_not(), -1e9);
                out = at::matmul(at::dropout(at::softmax(scores, -1), p, true), v);
              }
            }
            return at::linear(out.transpose(1, 2).reshape({B, T, d}), proj);
          }};
}

Layer shuffle() {
  return {"transpose+reshape", {}, {}, [](const at::Tensor& h) {
            return h.transpose(0, 1).contiguous().transpose(0, 1).reshape(h.sizes());
          }};
}

Layer sequence_layer(Rng& rng, int64_t d) {
  switch (pick(rng, 0, 10)) {
    case 0: return linear(rng, d);
    case 1: return mlp(rng, d);
    case 2: return layer_norm(d);
    case 3: return batch_norm_1d(d);
    case 4: return attention(rng, d);
    case 5: return residual(attention(rng, d), chance(rng, 0.5));
    case 6: return residual(mlp(rng, d), chance(rng, 0.5));
    case 7: return scalings(rng);
    case 8: return dropout(rng);
    case 9: return shuffle();
    default: return activation(rng);
  }
}

// ---- Images: [B, C, H, W] --------------------------------------------------------

Layer conv(Rng& rng, int64_t c) {
  at::Tensor w = param({c, c, 3, 3}, 1.0 / std::sqrt(9.0 * static_cast<double>(c)));
  at::Tensor b = param({c}, 0.1);
  const bool bias = chance(rng, 0.5);
  return {bias ? "conv" : "conv(no bias)",
          bias ? std::vector<at::Tensor>{w, b} : std::vector<at::Tensor>{w},
          {},
          [=](const at::Tensor& h) { return at::conv2d(h, w, bias ? b : at::Tensor(), 1, 1); }};
}

Layer batch_norm_2d(int64_t c) {
  at::Tensor w = param({c}, 0.1);
  at::Tensor b = param({c}, 0.1);
  at::Tensor mean = torch::zeros({c}), var = torch::ones({c});
  return {"batch_norm", {w, b}, {mean, var}, [=](const at::Tensor& h) {
            return at::batch_norm(h, w, b, mean, var, true, 0.1, 1e-5, false);
          }};
}

Layer pool(Rng& rng) {
  const bool max = chance(rng, 0.5);
  // Same size out: a 3x3 window, stride 1, padding 1.
  return {max ? "max_pool" : "avg_pool", {}, {}, [max](const at::Tensor& h) {
            return max ? at::max_pool2d(h, {3, 3}, {1, 1}, {1, 1})
                       : at::avg_pool2d(h, {3, 3}, {1, 1}, {1, 1});
          }};
}

Layer image_layer(Rng& rng, int64_t c) {
  switch (pick(rng, 0, 8)) {
    case 0:
    case 1: return conv(rng, c);
    case 2: return batch_norm_2d(c);
    case 3: return pool(rng);
    case 4: return residual(conv(rng, c), chance(rng, 0.5));
    case 5: return scalings(rng);
    case 6: return dropout(rng);
    default: return activation(rng);
  }
}

Model generate(uint64_t seed) {
  Rng rng(seed);
  torch::manual_seed(static_cast<int64_t>(seed % 100003));
  Model m;
  m.image = chance(rng, 0.4);
  const int64_t n = pick(rng, 3, 12);
  const int64_t width = m.image ? pick(rng, 2, 6) : 4 * pick(rng, 1, 6);
  for (int64_t i = 0; i < n; ++i) {
    m.layers.push_back(m.image ? image_layer(rng, width) : sequence_layer(rng, width));
  }
  if (m.image) {
    const int64_t side = pick(rng, 4, 10);
    m.x = torch::randn({pick(rng, 1, 3), width, side, side}).set_requires_grad(true);
  } else {
    m.x = torch::randn({pick(rng, 1, 3), pick(rng, 3, 24), width}).set_requires_grad(true);
  }
  // Regions: 1 to 4 contiguous ranges, with plain layers between some.
  const int64_t wanted = std::min<int64_t>(n, pick(rng, 1, 4));
  size_t at = 0;
  for (int64_t r = 0; r < wanted && at < m.layers.size(); ++r) {
    if (chance(rng, 0.3) && at + 1 < m.layers.size()) {
      ++at;  // a plain layer before this region
    }
    const size_t left = m.layers.size() - at;
    const size_t len = static_cast<size_t>(pick(rng, 1, std::max<int64_t>(1, left / 2 + 1)));
    m.regions.emplace_back(at, std::min(m.layers.size(), at + len));
    at += len;
  }
  // Drawn apart, so that each seed's model is what it was before loops.
  Rng loop_rng(seed ^ 0x100bULL);
  m.loop = static_cast<Loop>(pick(loop_rng, 0, kLoops - 1));
  m.batch_in_step = chance(loop_rng, 0.5);
  for (const at::Tensor& p : m.params()) {
    m.initial.push_back(p.detach().clone());
  }
  std::ostringstream out;
  out << (m.image ? "image " : "sequence ") << m.x.sizes() << ", "
      << kLoopNames[static_cast<int>(m.loop)] << (m.batch_in_step ? ", batch made in the step" : "")
      << "\n";
  for (size_t i = 0; i < m.layers.size(); ++i) {
    int region = -1;
    for (size_t r = 0; r < m.regions.size(); ++r) {
      if (i >= m.regions[r].first && i < m.regions[r].second) {
        region = static_cast<int>(r);
      }
    }
    out << "  " << i << ": " << m.layers[i].name
        << (region >= 0 ? "   [region " + std::to_string(region) + "]" : "") << "\n";
  }
  m.listing = out.str();
  return m;
}

// ---- Steps ------------------------------------------------------------------------

// What a step left: its loss, the gradients, and its peak over its start.
struct Step {
  std::vector<at::Tensor> values;
  int64_t peak = 0;
};

void zero_grad(Model& m) {
  for (at::Tensor& p : m.params()) {
    p.mutable_grad() = at::Tensor();
  }
}

// One step: every region checkpointed under its policy (none: no
// checkpointing at all). `run_region` can replace how a region runs.
using RunRegion = std::function<at::Tensor(
    size_t, const std::function<at::Tensor(const at::Tensor&)>&, const at::Tensor&)>;

at::Tensor forward(Model& m, const RunRegion& run_region, const at::Tensor& batch = {}) {
  at::Tensor h = batch.defined() ? batch : m.x;
  size_t i = 0;
  for (size_t r = 0; r <= m.regions.size(); ++r) {
    const size_t until = r < m.regions.size() ? m.regions[r].first : m.layers.size();
    for (; i < until; ++i) {
      h = m.layers[i].apply(h);
    }
    if (r == m.regions.size()) {
      break;
    }
    const auto [begin, end] = m.regions[r];
    auto body = [&m, begin = begin, end = end](const at::Tensor& in) {
      at::Tensor t = in;
      for (size_t j = begin; j < end; ++j) {
        t = m.layers[j].apply(t);
      }
      return t;
    };
    h = run_region(r, body, h);
    i = end;
  }
  return h;
}

// The step's forward and backward: what its peak is measured over. Its
// regions add to `statistics`, if given.
// Forward and backward passes per step: two where micro-batches accumulate
// (each region runs twice: a plan for the step has a policy per run).
size_t micro_batches(const Model& m) { return m.loop == Loop::Accumulated ? 2 : 1; }

// `per_region` repeated once per micro-batch: one per region run, in order.
template <class T>
std::vector<T> per_run(const Model& m, const std::vector<T>& per_region) {
  std::vector<T> out;
  for (size_t k = 0; k < micro_batches(m); ++k) {
    out.insert(out.end(), per_region.begin(), per_region.end());
  }
  return out;
}
sac::BudgetedPlan per_run(const Model& m, sac::BudgetedPlan plan) {
  plan.policies = per_run(m, plan.policies);
  plan.checkpointed = per_run(m, plan.checkpointed);
  plan.saved_calls = per_run(m, plan.saved_calls);
  return plan;
}

// The step's forwards and backwards: what its peak is measured over. Region
// runs take `policies` in order (one per region, again per micro-batch, or
// one per run). Its regions add to `statistics`, if given.
at::Tensor run(Model& m, const std::vector<sac::Policy>* policies,
               const std::shared_ptr<sac::RegionStatistics>& statistics = nullptr,
               const at::Tensor& batch = {}) {
  at::Tensor loss;
  for (size_t k = 0; k < micro_batches(m); ++k) {
    torch::manual_seed(7 + static_cast<int64_t>(k));
    at::Tensor out = forward(
        m,
        [&](size_t r, const auto& body, const at::Tensor& in) {
          if (policies == nullptr) {
            return body(in);
          }
          const size_t index = policies->size() > m.regions.size() ? k * m.regions.size() + r : r;
          return sac::checkpoint(
              sac::CheckpointOptions().policy((*policies)[index]).statistics(statistics), body, in);
        },
        batch);
    loss = (out * out).mean();
    loss.backward();
  }
  return loss.detach();
}

// Before each step: the parameters' first values, no optimizer state, and
// gradients as the loop leaves them between steps.
void prepare(Model& m) {
  const at::NoGradGuard no_grad;
  m.state.clear();
  const std::vector<at::Tensor> params = m.params();
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].detach().copy_(m.initial[i]);
    at::Tensor p = params[i];
    p.mutable_grad() = m.loop == Loop::NoneAtEnd ? at::Tensor() : at::zeros_like(p);
  }
}

// One training step in the model's loop (but its gradients set to none at
// the end, which the caller does: they are read first).
at::Tensor training_step(Model& m, const std::vector<sac::Policy>* policies,
                         const std::shared_ptr<sac::RegionStatistics>& statistics = nullptr) {
  if (m.loop == Loop::Left || m.loop == Loop::Optimizer || m.loop == Loop::Accumulated) {
    zero_grad(m);
  } else if (m.loop == Loop::ZeroedInPlace) {
    for (const at::Tensor& p : m.params()) {
      p.grad().zero_();
    }
  }
  const at::Tensor batch = m.batch_in_step ? m.x * 1 : at::Tensor();
  at::Tensor loss = run(m, policies, statistics, batch);
  if (m.loop == Loop::Optimizer) {
    const at::NoGradGuard no_grad;
    for (const at::Tensor& p : m.params()) {
      m.state.push_back(p.grad() * 0.9);
      p.detach().sub_(m.state.back() * 0.01);
    }
  }
  return loss;
}

Step step(Model& m, const std::vector<sac::Policy>* policies) {
  prepare(m);
  const int64_t before = CountingAllocator::live_bytes();
  CountingAllocator::reset_peak();
  at::Tensor loss = training_step(m, policies);
  Step s;
  s.peak = CountingAllocator::peak_bytes() - before;
  s.values.push_back(loss);
  for (const at::Tensor& p : m.params()) {
    s.values.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
  }
  if (m.loop == Loop::NoneAtEnd) {
    zero_grad(m);
  }
  return s;
}

bool bit_identical(const Step& a, const Step& b) {
  if (a.values.size() != b.values.size()) {
    return false;
  }
  for (size_t i = 0; i < a.values.size(); ++i) {
    if (a.values[i].defined() != b.values[i].defined()) {
      return false;
    }
    if (a.values[i].defined() && !at::equal(a.values[i], b.values[i])) {
      return false;
    }
  }
  return true;
}

sac::Policy random_policy(Rng& rng) {
  switch (pick(rng, 0, 6)) {
    case 0: return sac::everything_saveable();
    case 1: return sac::dots_saveable();
    case 2: return sac::compute_intensive_ops();
    case 3: return sac::outputs_larger_than(pick(rng, 1, 4) * 256);
    default: {
      const std::vector<std::string> names{"aten::addmm",
                                           "aten::mm",
                                           "aten::bmm",
                                           "aten::convolution",
                                           "aten::gelu",
                                           "aten::native_layer_norm",
                                           "aten::native_batch_norm",
                                           "aten::_softmax",
                                           "aten::native_dropout",
                                           "aten::mul.*",
                                           "aten::div.*",
                                           "aten::add.*",
                                           "aten::tanh",
                                           "aten::sigmoid",
                                           "aten::relu",
                                           "aten::_unsafe_view",
                                           "aten::max_pool2d_with_indices",
                                           "aten::avg_pool2d",
                                           "aten::silu",
                                           "aten::_scaled_dot_product_flash_attention_for_cpu",
                                           "aten::masked_fill.*",
                                           "aten::clone"};
      std::vector<std::string> chosen;
      for (const auto& name : names) {
        if (chance(rng, 0.3)) {
          chosen.push_back(name);
        }
      }
      if (chosen.empty()) {
        chosen.push_back("aten::mm");
      }
      return sac::Policy::save_ops(chosen);
    }
  }
}

struct Tally {
  size_t predictions = 0, refused = 0, peak_plans = 0, unchecked_peak_plans = 0;
  size_t unchecked_regions = 0, checkpointed_regions = 0;
  size_t reruns_checked = 0, calls_past_stop = 0, calls_profiled = 0;
  size_t tried_every_choice = 0, not_exact = 0;
  size_t loops[kLoops] = {};  // cases per Loop
  double greatest_gap = 0;
};

// The least recomputation of any plan within `budget` bytes, found by trying
// every choice: each region's keepable calls, those sharing a storage kept
// together (their storages' bytes counted once), and with `unchecked` each
// region left unchecked (its plain bytes, nothing recomputed). None if there
// are more than `most` choices.
std::optional<double> least_recomputation(const std::vector<sac::RegionProfile>& profiles,
                                          int64_t budget, bool unchecked, size_t most) {
  struct Choice {
    size_t region;
    int64_t bytes = 0;
    double seconds = 0;  // what keeping it saves
    bool whole = false;  // the region unchecked
  };
  std::vector<Choice> choices;
  double everything = 0;  // every call of every region recomputed
  for (size_t r = 0; r < profiles.size(); ++r) {
    const auto& calls = profiles[r].calls();
    std::vector<size_t> group(calls.size());
    for (size_t i = 0; i < calls.size(); ++i) {
      group[i] = i;
      for (const size_t j : calls[i].shares_storage_with) {
        const size_t from = group[i], to = group[j];
        std::replace(group.begin(), group.begin() + static_cast<std::ptrdiff_t>(i) + 1, from, to);
      }
    }
    double seconds = 0;
    std::vector<Choice> of_region(calls.size(), Choice{r});
    std::vector<bool> keepable(calls.size(), false);
    for (size_t i = 0; i < calls.size(); ++i) {
      seconds += calls[i].recompute_seconds();
      of_region[group[i]].bytes += calls[i].output_bytes;
      if (calls[i].keepable()) {
        keepable[group[i]] = true;
        of_region[group[i]].seconds += calls[i].recompute_seconds();
      }
    }
    everything += seconds;
    for (size_t g = 0; g < calls.size(); ++g) {
      if (keepable[g]) {
        choices.push_back(of_region[g]);
      }
    }
    if (unchecked && profiles[r].plain_bytes() >= 0) {
      choices.push_back({r, profiles[r].plain_bytes(), seconds, true});
    }
  }
  if (choices.size() > most) {
    return std::nullopt;
  }
  double least = everything;
  for (uint64_t set = 0; set < (uint64_t{1} << choices.size()); ++set) {
    int64_t bytes = 0;
    double saved = 0;
    std::vector<int> taken(profiles.size(), 0);  // 1: some calls, 2: unchecked
    bool valid = true;
    for (size_t c = 0; c < choices.size() && valid; ++c) {
      if ((set >> c & 1) == 0) {
        continue;
      }
      const int kind = choices[c].whole ? 2 : 1;
      valid = taken[choices[c].region] == 0 || taken[choices[c].region] == kind;
      taken[choices[c].region] = kind;
      bytes += choices[c].bytes;
      saved += choices[c].seconds;
    }
    if (valid && bytes <= budget) {
      least = std::min(least, everything - saved);
    }
  }
  return least;
}

// Runs one case; returns the failures' descriptions (none: it passed).
std::vector<std::string> run_case(uint64_t seed, Tally& tally, bool verbose) {
  Rng rng(seed ^ 0x9e3779b97f4a7c15ULL);
  Model m = generate(seed);
  ++tally.loops[static_cast<int>(m.loop)];
  std::vector<std::string> failures;
  const size_t regions = m.regions.size();
  auto fail = [&](std::string what) { failures.push_back(std::move(what)); };

  const Step plain = step(m, nullptr);
  const std::vector<sac::Policy> nothing(regions, sac::nothing_saveable());
  step(m, &nothing);  // one-time allocations out of the way
  const sac::MemoryProbe probe{[] { return CountingAllocator::live_bytes(); },
                               [] { return CountingAllocator::peak_bytes(); },
                               [] { CountingAllocator::reset_peak(); }};
  // Measured once, in the model's loop; never run plainly.
  prepare(m);
  const sac::StepPhases phases = sac::measure_step_phases(probe, [&] {
    training_step(m, &nothing);
    if (m.loop == Loop::NoneAtEnd) {
      zero_grad(m);
    }
  });
  if (verbose) {
    phases.print(std::cout);
  }
  const int64_t plain_peak = step(m, nullptr).peak;
  if (phases.plain_peak() != plain_peak) {
    fail("the plain step peaks at " + std::to_string(plain_peak) + ", but measure_step_phases " +
         "predicts " +
         (phases.plain_peak() ? std::to_string(*phases.plain_peak())
                              : "nothing: " + phases.why_no_plain_peak()));
  }

  // Profiles and explanations, each region at the input the step gives it.
  std::vector<sac::RegionProfile> profiles;
  torch::manual_seed(7);
  forward(m, [&](size_t, const auto& body, const at::Tensor& in) {
    at::Tensor out;
    profiles.push_back(sac::profile([&] { return out = body(in); }, 1));
    return out;
  });
  // What each region's policy keeps, by sac::explain.
  auto explained = [&](const std::vector<sac::Policy>& policies) {
    std::vector<std::vector<sac::SavedCall>> kept;
    torch::manual_seed(7);
    forward(m, [&](size_t r, const auto& body, const at::Tensor& in) {
      at::Tensor out;
      kept.push_back(sac::explain(policies[r], [&] { out = body(in); }).saved_calls());
      return out;
    });
    return kept;
  };

  // Checks a run under `policies` against `predicted` (if any) and plain.
  auto check = [&](const std::string& what, const std::vector<sac::Policy>& policies,
                   std::optional<int64_t> predicted, std::optional<int64_t> budget) {
    const Step s = step(m, &policies);
    if (!bit_identical(plain, s)) {
      fail(what + ": gradients differ from the plain step");
    }
    if (predicted.has_value()) {
      ++tally.predictions;
      if (*predicted != s.peak) {
        fail(what + ": predicted " + std::to_string(*predicted) + ", measured " +
             std::to_string(s.peak) + " (" + std::to_string(*predicted - s.peak) + ")");
      }
    }
    if (budget.has_value() && s.peak > *budget) {
      fail(what + ": measured " + std::to_string(s.peak) + " over the budget of " +
           std::to_string(*budget));
    }
    return s.peak;
  };
  auto predicted_or_refused =
      [&](const std::function<int64_t()>& predict) -> std::optional<int64_t> {
    try {
      return predict();
    } catch (const c10::Error& e) {
      const std::string message = e.what_without_backtrace();
      if (message.find("lies on the storage of an earlier call") == std::string::npos) {
        throw;
      }
      ++tally.refused;
      if (verbose) {
        std::cout << "refused: " << message << "\n";
      }
      return std::nullopt;
    }
  };

  for (const sac::RegionProfile& p : profiles) {
    for (const sac::OpCallProfile& call : p.calls()) {
      ++tally.calls_profiled;
      tally.calls_past_stop += call.past_stop ? 1 : 0;
    }
  }
  // The recomputation runs again the calls `plan` predicts, every region
  // checkpointed: each region's policy asked about every call, so that the
  // statistics count them all.
  auto check_reruns = [&](const std::string& what, const sac::BudgetedPlan& plan) {
    std::vector<sac::Policy> policies;
    size_t predicted = 0;
    for (size_t r = 0; r < regions; ++r) {
      policies.push_back(sac_examples::asked_about_every_call(plan.policies[r]));
      predicted +=
          micro_batches(m) * sac_examples::predicted_reruns(profiles[r], plan.saved_calls[r]);
    }
    auto statistics = std::make_shared<sac::RegionStatistics>();
    prepare(m);
    training_step(m, &policies, statistics);
    ++tally.reruns_checked;
    const size_t rerun = statistics->read().calls_rerun;
    if (rerun != predicted) {
      fail(what + ": the recomputation ran " + std::to_string(rerun) + " calls again, the plan " +
           "predicts " + std::to_string(predicted));
    }
  };
  // An exact plan recomputes the least any choice within its budget does.
  auto check_least = [&](const std::string& what, const sac::BudgetedPlan& plan, bool unchecked) {
    if (!plan.exact) {
      ++tally.not_exact;
      tally.greatest_gap = std::max(tally.greatest_gap, plan.gap_seconds);
      return;
    }
    const std::optional<double> least =
        least_recomputation(profiles, plan.budget_bytes, unchecked, 14);
    if (!least.has_value()) {
      return;
    }
    ++tally.tried_every_choice;
    if (plan.saved_bytes > plan.budget_bytes ||
        std::abs(plan.recompute_seconds - *least) > 1e-12 + 1e-9 * *least) {
      fail(what + ": recomputes " + std::to_string(plan.recompute_seconds * 1e6) + " us in " +
           std::to_string(plan.saved_bytes) + " bytes, but trying every choice within " +
           std::to_string(plan.budget_bytes) + " bytes finds " + std::to_string(*least * 1e6) +
           " us");
    }
  };

  // Nothing kept: the measured step itself.
  check("nothing kept", nothing, phases.peak(), std::nullopt);
  // Nothing checkpointed: predicted from the same trace.
  {
    const sac::BudgetedPlan unchecked = sac::budgeted_plan(profiles, sac::Budget::fraction(1.0));
    check("every region unchecked", unchecked.policies, phases.predict_peak(per_run(m, unchecked)),
          std::nullopt);
    if (verbose) {
      const sac::BudgetedPlan runs = per_run(m, unchecked);
      phases.print(std::cout, &runs);
    }
  }
  // Random policies, each region's own or one for all.
  for (int i = 0; i < 2; ++i) {
    std::vector<sac::Policy> policies;
    std::string names;
    for (size_t r = 0; r < regions; ++r) {
      policies.push_back(i == 0 && r > 0 ? policies.front() : random_policy(rng));
      names += (r > 0 ? ", " : "") + policies.back().describe();
    }
    const auto kept = explained(policies);
    check("policies [" + names + "]", policies,
          predicted_or_refused([&] { return phases.predict_peak(per_run(m, kept)); }),
          std::nullopt);
  }
  // Byte plans with unchecked regions as a choice (the default): each
  // region it checkpoints keeps fewer bytes than it would unchecked, and the
  // gradients are the plain step's.
  for (int i = 0; i < 2; ++i) {
    const double fraction = static_cast<double>(pick(rng, 0, 10)) / 10.0;
    const sac::BudgetedPlan plan =
        sac::budgeted_plan(profiles, sac::Budget::of_everything_saveable(fraction));
    const std::string what = "byte plan with unchecked regions at " + std::to_string(fraction);
    for (size_t r = 0; r < regions; ++r) {
      int64_t kept = 0;
      for (const sac::SavedCall& call : plan.saved_calls[r]) {
        kept += call.bytes;
      }
      ++(plan.checkpointed[r] ? tally.checkpointed_regions : tally.unchecked_regions);
      if (plan.checkpointed[r] && kept >= profiles[r].plain_bytes()) {
        fail(what + ": region " + std::to_string(r) + " keeps " + std::to_string(kept) +
             " bytes and recomputes, but keeps " + std::to_string(profiles[r].plain_bytes()) +
             " unchecked");
      }
    }
    check(what, plan.policies, phases.predict_peak(per_run(m, plan)), std::nullopt);
    check_least(what, plan, true);
  }
  // Random byte budgets, every region checkpointed.
  for (int i = 0; i < 2; ++i) {
    const double fraction = static_cast<double>(pick(rng, 0, 10)) / 10.0;
    const sac::BudgetedPlan plan = sac::budgeted_plan(
        profiles, sac::Budget::of_everything_saveable(fraction), std::nullopt, false);
    const std::string what = "byte plan at " + std::to_string(fraction);
    check(what, plan.policies,
          predicted_or_refused([&] { return phases.predict_peak(per_run(m, plan)); }),
          std::nullopt);
    check_least(what, plan, false);
    check_reruns(what, plan);
  }
  // Random peak budgets, ascending: measured under each, cost never rising.
  const int64_t low = phases.peak();
  const int64_t high = phases.predict_peak(
      per_run(m, sac::budgeted_plan(profiles, sac::Budget::of_everything_saveable(1.0),
                                    std::nullopt, false)));
  std::vector<int64_t> budgets{low};
  for (int i = 0; i < 3; ++i) {
    budgets.push_back(low + pick(rng, 0, std::max<int64_t>(0, high - low) + 64));
  }
  if (plain_peak > low) {
    budgets.push_back(plain_peak - 1);
  }
  budgets.push_back(plain_peak);
  std::sort(budgets.begin(), budgets.end());
  double last = std::numeric_limits<double>::infinity();
  for (const int64_t budget : budgets) {
    const sac::PeakPlan plan = phases.plan_for_peak(per_run(m, profiles), budget);
    ++tally.peak_plans;
    const std::string what = "peak plan at " + std::to_string(budget);
    if (plan.predicted_peak > budget) {
      fail(what + ": predicted " + std::to_string(plan.predicted_peak) + " over its budget");
    }
    if (plan.plan.recompute_seconds > last) {
      fail(what + ": recomputes " + std::to_string(plan.plan.recompute_seconds) +
           " s, more than at a smaller budget (" + std::to_string(last) + " s)");
    }
    last = plan.plan.recompute_seconds;
    const bool checkpoints_any =
        std::find(plan.plan.checkpointed.begin(), plan.plan.checkpointed.end(), true) !=
        plan.plan.checkpointed.end();
    tally.unchecked_peak_plans += checkpoints_any ? 0 : 1;
    if (budget >= plain_peak && (checkpoints_any || plan.plan.recompute_seconds > 0)) {
      fail(what + ": the plain step fits (" + std::to_string(plain_peak) +
           "), but the plan checkpoints");
    }
    const int64_t measured = check(what, plan.plan.policies, plan.predicted_peak, budget);
    if (checkpoints_any && plan.plan.recompute_seconds > 0 && measured >= plain_peak) {
      fail(what + ": the plan recomputes and peaks at " + std::to_string(measured) +
           ", no lower than the plain step's " + std::to_string(plain_peak));
    }
  }
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  size_t cases = 200;
  uint64_t seed = 1;
  std::vector<uint64_t> replay;
  bool verbose = false;
  size_t blocks = 1;  // bytes each allocation is rounded up to
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--cases" && i + 1 < argc) {
      cases = std::stoul(argv[++i]);
    } else if (arg == "--seed" && i + 1 < argc) {
      seed = std::stoull(argv[++i]);
    } else if (arg == "--replay" && i + 1 < argc) {
      replay.push_back(std::stoull(argv[++i]));
    } else if (arg == "--verbose") {
      verbose = true;
    } else if (arg == "--blocks" && i + 1 < argc) {
      blocks = std::stoul(argv[++i]);
    } else {
      std::cerr << "usage: sac_peak_models [--cases N] [--seed S] [--replay SEED] [--blocks B] "
                   "[--verbose]\n";
      return 2;
    }
  }
  if (const char* env = std::getenv("SAC_PEAK_CASES")) {
    cases = std::stoul(env);
  }
  CountingAllocator::install();
  // Blocks of 512 bytes are what CUDA's caching allocator hands out: its
  // allocated bytes, modelled on the CPU.
  CountingAllocator::round_to(blocks);
  at::set_num_threads(1);
  std::vector<uint64_t> seeds = replay;
  if (seeds.empty()) {
    Rng rng(seed);
    for (size_t i = 0; i < cases; ++i) {
      seeds.push_back(rng());
    }
  }
  const auto start = std::chrono::steady_clock::now();
  Tally tally;
  size_t passed = 0, failed = 0;
  for (const uint64_t s : seeds) {
    std::vector<std::string> failures;
    try {
      failures = run_case(s, tally, verbose || !replay.empty());
    } catch (const std::exception& e) {
      failures.push_back(std::string("an exception: ") + e.what());
    }
    if (failures.empty()) {
      ++passed;
      continue;
    }
    ++failed;
    std::cout << "FAILED seed " << s << " (replay: sac_peak_models --replay " << s << ")\n"
              << generate(s).listing;
    for (const auto& f : failures) {
      std::cout << "  " << f.substr(0, f.find("\nException raised")) << "\n";
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "sac_peak_models: " << seeds.size() << " models in " << seconds << " s; "
            << tally.predictions << " predictions checked, " << tally.refused
            << " refused (documented), " << tally.peak_plans << " peak plans ("
            << tally.unchecked_peak_plans << " checkpointing nothing); byte plans with unchecked "
            << "regions: " << tally.unchecked_regions << " regions unchecked, "
            << tally.checkpointed_regions << " checkpointed; " << tally.calls_past_stop << " of "
            << tally.calls_profiled << " profiled calls past the recomputation's stop; "
            << tally.reruns_checked << " recomputations ran the calls predicted; "
            << tally.tried_every_choice << " byte plans checked against every choice ("
            << tally.not_exact << " not exact, greatest gap " << tally.greatest_gap * 1e6
            << " us); loops:";
  for (int loop = 0; loop < kLoops; ++loop) {
    std::cout << (loop > 0 ? "," : "") << " " << tally.loops[loop] << " " << kLoopNames[loop];
  }
  std::cout << "\n";
  std::cout << passed << " passed, " << failed << " failed\n";
  return failed == 0 ? 0 : 1;
}
