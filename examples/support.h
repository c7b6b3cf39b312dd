// Models and an exact CPU memory counter, shared by the demo and the tests.
#pragma once

#include <sac/lab/budget.h>
#include <sac/lab/profile.h>
#include <sac/policy/policy.h>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace sac_examples {

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t in, int64_t hidden, int64_t out, int64_t depth) {
    for (int64_t i = 0; i < depth; ++i) {
      layers->push_back(torch::nn::Linear(i == 0 ? in : hidden, i + 1 == depth ? out : hidden));
    }
    register_module("layers", layers);
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = x;
    for (size_t i = 0; i < layers->size(); ++i) {
      h = layers[i]->as<torch::nn::Linear>()->forward(h);
      if (i + 1 < layers->size()) {
        h = torch::relu(h);
      }
    }
    return h;
  }
  torch::nn::ModuleList layers;
};
TORCH_MODULE(Mlp);

// A GPT-2 style block: pre-layer-norm causal self-attention (SDPA) and a GELU
// MLP, with dropout and residual adds.
struct GptBlockImpl : torch::nn::Module {
  GptBlockImpl(int64_t embed, int64_t heads, double dropout) : heads(heads), dropout(dropout) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({embed})));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({embed})));
    qkv = register_module("qkv", torch::nn::Linear(embed, 3 * embed));
    proj = register_module("proj", torch::nn::Linear(embed, embed));
    fc = register_module("fc", torch::nn::Linear(embed, 4 * embed));
    fc_out = register_module("fc_out", torch::nn::Linear(4 * embed, embed));
  }
  at::Tensor forward(const at::Tensor& x) {
    const auto B = x.size(0), T = x.size(1), C = x.size(2);
    // Linears run on (B*T, C): one fused aten::addmm each, as Python's
    // F.linear does. (LibTorch's C++ linear on 3-D input runs aten::mm and
    // adds the bias in place, which leaves nothing of it worth caching.)
    auto flat = x.reshape({B * T, C});
    auto parts = qkv->forward(ln1->forward(flat)).view({B, T, 3 * C}).split(C, /*dim=*/2);
    auto heads_of = [&](const at::Tensor& t) {
      return t.view({B, T, heads, C / heads}).transpose(1, 2);
    };
    auto attn = at::scaled_dot_product_attention(heads_of(parts[0]), heads_of(parts[1]),
                                                 heads_of(parts[2]), /*attn_mask=*/{},
                                                 /*dropout_p=*/0.0, /*is_causal=*/true);
    attn = attn.transpose(1, 2).reshape({B * T, C});
    auto h = flat + torch::dropout(proj->forward(attn), dropout, is_training());
    auto m = fc_out->forward(torch::gelu(fc->forward(ln2->forward(h))));
    return (h + torch::dropout(m, dropout, is_training())).view({B, T, C});
  }
  int64_t heads;
  double dropout;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc{nullptr}, fc_out{nullptr};
};
TORCH_MODULE(GptBlock);

// A CPU allocator that counts live bytes exactly, and reports each block to
// c10's memory reporting. Installed for the whole process on first use; only
// allocations made after that are counted.
class CountingAllocator final : public c10::Allocator {
 public:
  static void install() {
    static CountingAllocator* allocator = [] {
      auto* counting = new CountingAllocator();
      c10::SetCPUAllocator(counting, /*priority=*/100);
      return counting;
    }();
    (void)allocator;
  }
  static int64_t live_bytes() { return live().load(); }
  static int64_t peak_bytes() { return peak().load(); }
  static void reset_peak() { peak().store(live().load()); }
  // Counts (and reports) each block rounded up to a multiple of `bytes`, as
  // CUDA's caching allocator rounds its blocks to 512 bytes; 1 counts exact
  // sizes. Blocks keep the size they were counted with.
  static void round_to(size_t bytes) { rounding().store(bytes == 0 ? 1 : bytes); }
  // Refuses an allocation that would take the live bytes over `bytes`, as a
  // device out of memory does (0: no limit).
  static void limit_to(int64_t bytes) { limit().store(bytes); }

  c10::DataPtr allocate(size_t requested) override {
    const size_t unit = rounding().load();
    const size_t bytes = (requested + unit - 1) / unit * unit;
    const int64_t most = limit().load();
    TORCH_CHECK_WITH(OutOfMemoryError,
                     most == 0 || live().load() + static_cast<int64_t>(bytes) <= most,
                     "CountingAllocator: out of memory: ", bytes, " bytes more than the limit of ",
                     most, " (", live().load(), " live).");
    // The size lives in a header before the data: LibTorch's raw_allocate
    // needs the context to be the data pointer itself.
    auto* base = static_cast<char*>(c10::alloc_cpu(bytes + kHeader));
    *reinterpret_cast<size_t*>(base) = bytes;
    const int64_t now = live().fetch_add(static_cast<int64_t>(bytes)) + static_cast<int64_t>(bytes);
    int64_t high = peak().load();
    while (now > high && !peak().compare_exchange_weak(high, now)) {
    }
    void* data = base + kHeader;
    report(data, static_cast<int64_t>(bytes), now);
    return {data, data, &free_counted, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_counted; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  static constexpr size_t kHeader = 64;  // keeps the data 64-byte aligned
  static std::atomic<int64_t>& live() {
    static std::atomic<int64_t> bytes{0};
    return bytes;
  }
  static std::atomic<int64_t>& peak() {
    static std::atomic<int64_t> bytes{0};
    return bytes;
  }
  static std::atomic<int64_t>& limit() {
    static std::atomic<int64_t> bytes{0};
    return bytes;
  }
  static std::atomic<size_t>& rounding() {
    static std::atomic<size_t> bytes{1};
    return bytes;
  }
  static void free_counted(void* data) {
    char* base = static_cast<char*>(data) - kHeader;
    const auto bytes = static_cast<int64_t>(*reinterpret_cast<size_t*>(base));
    report(data, -bytes, live().fetch_sub(bytes) - bytes);
    c10::free_cpu(base);
  }
  // To c10's memory reporting, as c10's own CPU allocator does, so that
  // PyTorch's memory profiler and sac::measure_step_phases hear each block.
  static void report(void* data, int64_t bytes, int64_t live_now) {
    if (c10::memoryProfilingEnabled()) {
      c10::reportMemoryUsageToProfiler(data, bytes, static_cast<size_t>(live_now), 0,
                                       c10::Device(c10::DeviceType::CPU));
    }
  }
};

// `policy`, asked about every cacheable call: a region's statistics
// (RegionStatistics::Counts::calls_rerun) then count every call its
// recomputation runs again, not only the calls of the ops the policy names.
inline sac::Policy asked_about_every_call(sac::Policy policy) {
  class Rule final : public sac::Policy::Rule {
   public:
    explicit Rule(sac::Policy policy) : policy_(std::move(policy)) {}
    sac::CheckpointPolicy decide(const sac::SelectiveCheckpointContext& ctx,
                                 const c10::OperatorHandle& op,
                                 c10::ArrayRef<c10::IValue> args) const override {
      return policy_.decide(ctx, op, args);
    }
    sac::Policy::Domain domain() const override { return sac::Policy::Domain::every_cacheable(); }
    std::string describe() const override { return policy_.describe(); }
    bool checkpoints() const override { return policy_.checkpoints(); }

   private:
    sac::Policy policy_;
  };
  return sac::Policy(std::make_shared<Rule>(std::move(policy)));
}

// The calls the recomputation of a region runs again, by its profile: the
// cacheable calls before its stop (OpCallProfile::past_stop) that `kept`
// (a plan's saved_calls for the region) does not hold.
inline size_t predicted_reruns(const sac::RegionProfile& profile,
                               const std::vector<sac::SavedCall>& kept) {
  size_t reruns = 0;
  for (const sac::OpCallProfile& call : profile.calls()) {
    const bool saved = std::any_of(kept.begin(), kept.end(), [&](const sac::SavedCall& k) {
      return k.op == call.op && k.call == call.call && !k.demoted;
    });
    reruns += call.cacheable && !call.past_stop && !saved ? 1 : 0;
  }
  return reruns;
}

}  // namespace sac_examples
