#!/usr/bin/env bash
# Build and run all sac tests with Bazel, offline. This is what CI calls.
#
#   bazel/test.sh                 # bazel test //...
#   bazel/test.sh //:foo_test     # other targets / extra bazel flags
#   bazel/test.sh build --nobuild //...   # another bazel command (here:
#                                         # analyse every target, build none)
#
# Environment:
#   SAC_BAZEL_CACHE  Bazel output root (default ${XDG_CACHE_HOME:-$HOME/.cache}/sac-bazel);
#                    kept outside the repository so the tree stays clean.
#   SAC_PYTHON       python with torch installed (default: python3 on PATH).
#   BAZEL            bazel binary (default: bazel).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

if [[ -z ${BAZEL:-} ]]; then
  bash .ci/install bazel-bootstrap
fi
bazel_bin="${BAZEL:-bazel}"
output_root="${SAC_BAZEL_CACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/sac-bazel}"
mkdir -p "$output_root"

command=test
if [[ ${1:-} == build ]]; then
  command=build
  shift
fi
if [[ $# -eq 0 ]]; then
  set -- //...
fi

# --output_user_root: Bazel keys the output base by workspace path below it.
# --disk_cache: actions are shared by every checkout (a fresh clone in CI
# rebuilds nothing that an earlier checkout built the same way).
# Exit status is Bazel's (nonzero when anything fails to build or a test fails).
exec "$bazel_bin" --output_user_root="$output_root" \
  "$command" --disk_cache="$output_root/disk-cache" --keep_going "$@"
