#!/usr/bin/env bash
# Per-op cost of sac, both ways: instructions per op call (callgrind,
# deterministic) and ns per op call (Google Benchmark, minimum over
# repetitions; noisy on shared machines); then a region guard's replay
# against sac::checkpoint's function rerun on a GPT stack. Builds what it
# needs.
#   bash benchmarks/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/install
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind >/dev/null; }
bash .ci/build -DSAC_BUILD_BENCHMARKS=ON
bin=${SAC_BUILD_DIR:-build}/benchmarks
for mechanism in per_op fallback; do
  echo "== SAC_DISPATCH=$mechanism: instructions per aten::mul call"
  for variant in no_sac idle listed unlisted callback; do
    total=$(SAC_DISPATCH=$mechanism valgrind --tool=callgrind --collect-atstart=no \
      --toggle-collect='*measured_loop*' --callgrind-out-file=/dev/null \
      "$bin/per_op_instructions" "$variant" 2>&1 | sed -n 's/.*Collected : \([0-9]*\).*/\1/p')
    printf '  %-9s %8d\n' "$variant" $((total / 1000))
  done
done
for mechanism in per_op fallback; do
  echo "== SAC_DISPATCH=$mechanism: ns per aten::mul call (min of 15 repetitions; batch rows are per 4096 calls)"
  SAC_DISPATCH=$mechanism "$bin/per_op_cost" --benchmark_repetitions=15 \
    --benchmark_report_aggregates_only=true 2>&1 | grep -E '_min'
done
echo "== region replay against function rerun (SAC_DISPATCH=fallback)"
SAC_DISPATCH=fallback "$bin/region_replay" 4 10
