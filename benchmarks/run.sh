#!/usr/bin/env bash
# Every benchmark table and the plot of BENCHMARKS.md, sac side by side with
# PyTorch's own SAC, from a fresh machine:
#   bash benchmarks/run.sh [benchmarks/side_by_side.py flags]
# Installs and builds what it needs (Google Benchmark, valgrind for the
# instruction counts), then, pinned to one CPU core with one intra-op thread
# on both sides:
#   * benchmarks/side_by_side.py: per-op cost under both mechanisms with the
#     null kernel; the step benchmark on the small, medium and large GPT against
#     torch.utils.checkpoint; the plot;
#   * the same step benchmark on CUDA, fp32 and bf16 autocast, when this
#     machine's torch sees a GPU (skipped, and said so, otherwise);
#   * a region guard's replay against sac::checkpoint's function rerun;
#   * benchmarks/python_door.py: sac's Python package beside PyTorch's SAC
#     (per-op cost, and steps and bytes on two Hugging Face models), under
#     both mechanisms.
# Output: ${SAC_BENCHMARKS_OUT:-benchmarks_out}/ (side_by_side.md has every
# table; per_op.csv, steps.csv, frontier.png).
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/install
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind >/dev/null; }
bash .ci/build -DSAC_BUILD_BENCHMARKS=ON
build=${SAC_BUILD_DIR:-build}
out=${SAC_BENCHMARKS_OUT:-benchmarks_out}
mkdir -p "$out"
# The last core: the one least likely to be serving the shell.
core=$(($(nproc) - 1))
pinned=(taskset -c "$core")
echo "== pinned to CPU $core, 1 intra-op thread per side"
"${pinned[@]}" python3 benchmarks/side_by_side.py --build "$build" --out "$out" "$@"

if python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  for autocast in none bf16; do
    echo "== CUDA, autocast $autocast"
    python3 benchmarks/side_by_side.py --build "$build" --device cuda --autocast "$autocast" \
      --no-per-op --out "$out/cuda_$autocast" "$@"
  done
else
  echo "== CUDA: skipped: this machine's torch sees no GPU (torch.cuda.is_available() is False)" \
    | tee "$out/cuda_skipped.txt"
fi

echo "== region replay against function rerun (SAC_DISPATCH=fallback)"
SAC_DISPATCH=fallback "${pinned[@]}" "$build/benchmarks/region_replay" 4 10 | tee "$out/region_replay.txt"

echo "== sac's Python package beside PyTorch's SAC"
SAC_BUILD_DIR=$build bash .ci/python >/dev/null
for dispatch in per_op fallback; do
  SAC_DISPATCH=$dispatch "${pinned[@]}" python3 benchmarks/python_door.py \
    --allocator "$build/benchmarks/libsac_counting_allocator.so" --out "$out/python_door_$dispatch.md"
done
