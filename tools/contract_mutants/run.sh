#!/usr/bin/env bash
# Sees each contract test of tests/contract_test.cpp fail when its c10
# internal is changed on purpose (docs/c10-contract.md):
#
#   tools/contract_mutants/run.sh [BUILD_DIR]     (default: build)
#
# Seven internals are changed at run time, by a library preloaded into
# sac_tests (mutant.cpp, SAC_MUTANT=...); the two that are compile-time
# facts are changed in a copy of torch's header that the contract test is
# compiled against (an eighth infra mode key: the test fails; a second
# member in c10::VariableVersion: the build fails on sac's static_assert).
# Exits non-zero if any mutant survives. Against the torch of ${PYTHON:-python3}
# (.ci/test runs it for each release, in that release's build).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=$(realpath "${1:-build}")
torch=$("${PYTHON:-python3}" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=(-std=c++20 -D_GLIBCXX_USE_CXX11_ABI=1 -isystem "$torch/include"
       -isystem "$torch/include/torch/csrc/api/include")
g++ -shared -fPIC -O0 "${flags[@]}" -o "$work/libmutant.so" tools/contract_mutants/mutant.cpp \
  -L"$torch/lib" -ltorch_cpu -lc10 -ldl
export LD_LIBRARY_PATH="$torch/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

survived=0
expect_failure() {  # item, what to run...
  local item=$1
  shift
  local log
  log=$("$@" 2>&1 || true)
  if grep -q "c10 contract, \"$item\"" <<<"$log" || grep -q "c10::VariableVersion is expected" <<<"$log"; then
    echo "[contract mutants] $item: changed, and its contract test failed"
  else
    echo "[contract mutants] $item: changed, and no contract test failed" >&2
    survived=1
  fi
}
for mutant in "Fake key:fake_key" "Memory reports:memory_reports" "Factory ops:factory_ops" \
  "Functional collectives:functional_collectives" "Saved-tensor hooks state:hooks_state" \
  "Engine stub:engine_stub" "Raw key set:raw_key_set"; do
  item=${mutant%%:*}
  expect_failure "$item" env SAC_MUTANT="${mutant##*:}" LD_PRELOAD="$work/libmutant.so" \
    SAC_DISPATCH=per_op "$build/tests/sac_tests" --gtest_filter='C10Contract.*'
done
# Unchanged, the preloaded library changes nothing.
env SAC_MUTANT=none LD_PRELOAD="$work/libmutant.so" SAC_DISPATCH=per_op \
  "$build/tests/sac_tests" --gtest_filter='C10Contract.*' >/dev/null

overlay() {  # header, sed script: a copy of torch's header, changed
  mkdir -p "$work/overlay/$(dirname "$1")"
  sed "$2" "$torch/include/$1" >"$work/overlay/$1"
}
overlay c10/core/impl/TorchDispatchModeTLS.h 's/^  FUNCTIONAL,$/  FUNCTIONAL,\n  MUTANT,/'
g++ -O0 -I"$work/overlay" -I. -Itests "${flags[@]}" \
  tests/contract_test.cpp -o "$work/infra" "$build/tests/libsac_test_support.a" \
  -L"$build" -lsac -lgtest_main -lgtest -L"$torch/lib" -ltorch -ltorch_cpu -lc10 -lpthread \
  -Wl,-rpath,"$build"
expect_failure "Infra mode keys" "$work/infra" --gtest_filter='C10Contract.Infra*'
rm -rf "$work/overlay"
overlay c10/core/TensorImpl.h \
  's/^  c10::intrusive_ptr<VersionCounter> version_counter_;$/&\n  void* mutant_ = nullptr;/'
expect_failure "Version counter" g++ -fsyntax-only -I"$work/overlay" -I. -Itests "${flags[@]}" \
  tests/contract_test.cpp
exit $survived
