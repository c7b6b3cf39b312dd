// Per-op cost of sac's interception, in ns per op call.
//
// Run once per dispatch mechanism (it is fixed per process):
//   SAC_DISPATCH=per_op   build/benchmarks/per_op_cost --benchmark_repetitions=15
//   SAC_DISPATCH=fallback build/benchmarks/per_op_cost --benchmark_repetitions=15
// and read the `_min` rows (items_per_second: op calls per second).
// Benchmarks run in the order below; the first runs before sac has
// registered anything. The op is aten::mul.Tensor on 1-element CPU tensors,
// where dispatch overhead dominates.
#include <sac/sac.h>

#include <benchmark/benchmark.h>
#include <algorithm>
#include <vector>
#include <torch/torch.h>

namespace {

at::Tensor a, b;

void setup() {
  if (!a.defined()) {
    a = torch::ones({1});
    b = torch::ones({1});
  }
}

// Ops per batch before the modes (and their cache) are renewed, so the
// cache does not grow without bound.
constexpr int64_t kBatch = 4096;

void run_under(benchmark::State& state, const sac::Policy& policy, const at::Tensor& lhs) {
  setup();
  while (state.KeepRunning()) {
    state.PauseTiming();
    auto modes = sac::create_selective_checkpoint_contexts(policy);
    {
      sac::ContextScope caching(modes.caching.get());
      state.ResumeTiming();
      for (int64_t i = 0; i < kBatch; ++i) {
        benchmark::DoNotOptimize(at::mul(lhs, b));
      }
      state.PauseTiming();
    }
    modes = {};
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}

void NoSac(benchmark::State& state) {
  setup();
  for (auto _ : state) {
    benchmark::DoNotOptimize(at::mul(a, b));
  }
  state.SetItemsProcessed(state.iterations());
}

// Kernels registered (per-op mechanism) for aten::mul.Tensor, no mode active.
void InstalledIdle(benchmark::State& state) {
  setup();
  sac::create_selective_checkpoint_contexts(sac::Policy::save_ops({"aten::mul.Tensor"}));
  for (auto _ : state) {
    benchmark::DoNotOptimize(at::mul(a, b));
  }
  state.SetItemsProcessed(state.iterations());
}

void OpListListedOp(benchmark::State& state) {
  run_under(state, sac::Policy::save_ops({"aten::mul.Tensor"}), a);
}

void OpListUnlistedOp(benchmark::State& state) {
  run_under(state, sac::Policy::save_ops({"aten::mm"}), a);
}

void CallbackPolicy(benchmark::State& state) {
  run_under(state,
            sac::Policy::from_fn([](const sac::SelectiveCheckpointContext&, const c10::OperatorHandle&,
                                    c10::ArrayRef<c10::IValue>) { return false; }),
            a);
}

// This machine is noisy: the minimum over repetitions is the stable number.
double minimum(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }
#define SAC_BENCHMARK(fn) BENCHMARK(fn)->ComputeStatistics("min", minimum)

SAC_BENCHMARK(NoSac);
SAC_BENCHMARK(InstalledIdle);
SAC_BENCHMARK(OpListListedOp);
SAC_BENCHMARK(OpListUnlistedOp);
SAC_BENCHMARK(CallbackPolicy);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  std::printf("dispatch mechanism: %s\n",
              std::string(sac::dispatch::to_string(sac::dispatch::mechanism())).c_str());
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
