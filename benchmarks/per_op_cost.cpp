// Per-op cost of sac's interception, in ns per op call (Google Benchmark).
//
// Run once per dispatch mechanism (it is fixed per process, and the null
// kernel reads it from SAC_DISPATCH):
//   SAC_DISPATCH=per_op   build/benchmarks/per_op_cost --benchmark_repetitions=15
//   SAC_DISPATCH=fallback build/benchmarks/per_op_cost --benchmark_repetitions=15
// and read the `_min` rows: items_per_second is op calls per second.
// benchmarks/side_by_side.py runs both and turns them into the per-op table.
//
// Each benchmark takes the op as its argument: 0 is aten::mul.Tensor on
// 1-element tensors, where dispatch dominates; 1 is aten::mm of two 256x256
// matrices, where the kernel does. They run in the order below: NoSac and the
// NullKernel before anything asks sac for its mechanism.
#include <sac/sac.h>

#include "benchmarks/null_kernel.h"

#include <sac/check/internal/checksum.h>

#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

struct OpCase {
  c10::OperatorName op;
  std::string listed;    // an op list naming the op
  std::string unlisted;  // an op list that does not
  int64_t batch;         // calls per batch: the modes (and the cache) are renewed per batch
  at::Tensor lhs, rhs;
  at::Tensor (*run)(const at::Tensor&, const at::Tensor&);  // the op, not a name compared per call

  at::Tensor call() const { return run(lhs, rhs); }
};

at::Tensor mul(const at::Tensor& a, const at::Tensor& b) { return at::mul(a, b); }
at::Tensor mm(const at::Tensor& a, const at::Tensor& b) { return at::mm(a, b); }

const OpCase& op_case(int64_t which) {
  static const std::vector<OpCase> cases = [] {
    torch::manual_seed(0);
    return std::vector<OpCase>{
        {{"aten::mul", "Tensor"},
         "aten::mul.Tensor",
         "aten::mm",
         4096,
         torch::ones({1}),
         torch::ones({1}),
         &mul},
        // Fewer calls per batch: a listed mm keeps 256 KiB per call.
        {{"aten::mm", ""},
         "aten::mm",
         "aten::mul.Tensor",
         64,
         torch::randn({256, 256}),
         torch::randn({256, 256}),
         &mm},
    };
  }();
  return cases.at(static_cast<size_t>(which));
}

void run_batches(benchmark::State& state, const OpCase& c) {
  for (auto _ : state) {
    for (int64_t i = 0; i < c.batch; ++i) benchmark::DoNotOptimize(c.call());
  }
  state.SetItemsProcessed(state.iterations() * c.batch);
}

// Each batch runs under a fresh caching mode.
void run_caching(benchmark::State& state, const sac::Policy& policy) {
  const OpCase& c = op_case(state.range(0));
  while (state.KeepRunning()) {
    state.PauseTiming();
    {
      auto modes = sac::create_selective_checkpoint_contexts(policy);
      sac::RegionContext::Scope caching(modes.caching.get());
      state.ResumeTiming();
      for (int64_t i = 0; i < c.batch; ++i) benchmark::DoNotOptimize(c.call());
      state.PauseTiming();
    }
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * c.batch);
}

void NoSac(benchmark::State& state) { run_batches(state, op_case(state.range(0))); }

// A do-nothing boxed kernel where sac's sits.
void NullKernel(benchmark::State& state) {
  const OpCase& c = op_case(state.range(0));
  sac_benchmarks::NullKernel null_kernel(c.op);
  run_batches(state, c);
}

// sac's kernels registered (per-op mechanism) for the op, no mode active.
void Idle(benchmark::State& state) {
  const OpCase& c = op_case(state.range(0));
  sac::create_selective_checkpoint_contexts(sac::Policy::save_ops({c.listed}));
  run_batches(state, c);
}

void OpListUnlisted(benchmark::State& state) {
  run_caching(state, sac::Policy::save_ops({op_case(state.range(0)).unlisted}));
}

void OpListListed(benchmark::State& state) {
  run_caching(state, sac::Policy::save_ops({op_case(state.range(0)).listed}));
}

void Callback(benchmark::State& state) {
  run_caching(state, sac::Policy::from_fn([](const sac::SelectiveCheckpointContext&,
                                             const c10::OperatorHandle&,
                                             c10::ArrayRef<c10::IValue>) { return false; }));
}

// The cached mode serving saved calls: each batch is saved by a caching
// mode (untimed), then replayed.
void CachedReplay(benchmark::State& state) {
  const OpCase& c = op_case(state.range(0));
  const auto policy = sac::Policy::save_ops({c.listed});
  while (state.KeepRunning()) {
    state.PauseTiming();
    {
      auto modes = sac::create_selective_checkpoint_contexts(policy);
      {
        sac::RegionContext::Scope caching(modes.caching.get());
        for (int64_t i = 0; i < c.batch; ++i) c.call();
      }
      sac::RegionContext::Scope cached(modes.cached.get());
      state.ResumeTiming();
      for (int64_t i = 0; i < c.batch; ++i) benchmark::DoNotOptimize(c.call());
      state.PauseTiming();
    }
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * c.batch);
}

// This machine is noisy: the minimum over repetitions is the stable number.
double minimum(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }
#define SAC_BENCHMARK(fn) BENCHMARK(fn)->Arg(0)->Arg(1)->ComputeStatistics("min", minimum)

SAC_BENCHMARK(NoSac);
SAC_BENCHMARK(NullKernel);
SAC_BENCHMARK(Idle);
SAC_BENCHMARK(OpListUnlisted);
SAC_BENCHMARK(OpListListed);
SAC_BENCHMARK(Callback);
// Google Benchmark's minimum time counts timed time only: a replayed mm batch
// takes 0.2 ms against its untimed 25 ms forward, so it gets a fixed count.
BENCHMARK(CachedReplay)->Arg(0)->ComputeStatistics("min", minimum);
BENCHMARK(CachedReplay)->Arg(1)->Iterations(20)->ComputeStatistics("min", minimum);

// The value check's cost per saved tensor (DeterminismCheck::Values): one
// checksum in the forward and one in the recomputation, of float tensors
// of 2^Arg bytes, by reading memory (the CPU's path) and by tensor ops (an
// accelerator's path, run here on the CPU).
void ValueChecksum(benchmark::State& state) {
  const bool ops = state.range(1) != 0;
  sac::detail::checksum_with_tensor_ops_for_testing(ops);
  const at::Tensor t = torch::randn({int64_t{1} << (state.range(0) - 2)});
  for (auto _ : state) {
    benchmark::DoNotOptimize(sac::detail::ValueChecksum::of(t));
  }
  sac::detail::checksum_with_tensor_ops_for_testing(false);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(t.nbytes()));
  state.SetLabel(ops ? "tensor ops" : "memory");
}
BENCHMARK(ValueChecksum)
    ->ArgsProduct({{10, 16, 20, 24}, {0, 1}})
    ->ComputeStatistics("min", minimum);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  at::set_num_threads(1);
  benchmark::RunSpecifiedBenchmarks();
  // Asked only now: asking chooses the mechanism, which must wait for the null kernel.
  std::fprintf(stderr, "dispatch mechanism: %s\n",
               std::string(sac::dispatch::to_string(sac::dispatch::mechanism())).c_str());
  return 0;
}
