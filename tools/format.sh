#!/usr/bin/env bash
# Formats sac's C++ sources (every tracked *.h, *.cpp and *.cc file) with clang-format and the
# repository's .clang-format.
#
#   tools/format.sh           format the files in place
#   tools/format.sh --check   change nothing; list the files that need formatting and exit 1
#                             if there are any
#
# The style was tuned with clang-format 14 (Debian 12: apt-get install clang-format); other
# versions may format some lines differently. Set CLANG_FORMAT to use a particular binary.
set -euo pipefail

usage() {
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
}

check=0
case "${1:-}" in
  "") ;;
  --check) check=1 ;;
  -h | --help)
    usage
    exit 0
    ;;
  *)
    echo "format.sh: unknown argument '$1'" >&2
    usage >&2
    exit 2
    ;;
esac
if [[ $# -gt 1 ]]; then
  echo "format.sh: expected at most one argument" >&2
  usage >&2
  exit 2
fi

clang_format="${CLANG_FORMAT:-}"
if [[ -z "$clang_format" ]]; then
  for candidate in clang-format clang-format-14; do
    if command -v "$candidate" >/dev/null 2>&1; then
      clang_format="$candidate"
      break
    fi
  done
fi
if [[ -z "$clang_format" ]] || ! command -v "$clang_format" >/dev/null 2>&1; then
  echo "format.sh: clang-format not found (looked for ${CLANG_FORMAT:-clang-format and clang-format-14})." >&2
  echo "  Install it (Debian/Ubuntu: apt-get install clang-format) or set CLANG_FORMAT." >&2
  exit 2
fi

version="$("$clang_format" --version)"
if [[ "$version" != *"version 14."* ]]; then
  echo "format.sh: note: .clang-format was tuned with clang-format 14; using: $version" >&2
fi

root="$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
cd "$root"
if [[ ! -f .clang-format ]]; then
  echo "format.sh: $root/.clang-format is missing" >&2
  exit 2
fi

files=()
while IFS= read -r -d '' file; do
  files+=("$file")
done < <(git ls-files -z -- '*.h' '*.cpp' '*.cc')
if [[ ${#files[@]} -eq 0 ]]; then
  echo "format.sh: no tracked C++ files found" >&2
  exit 0
fi

if [[ $check -eq 0 ]]; then
  printf '%s\0' "${files[@]}" | xargs -0 -n 32 "$clang_format" -i --style=file
  echo "format.sh: formatted ${#files[@]} files with $clang_format"
  exit 0
fi

unformatted=()
for file in "${files[@]}"; do
  if ! output="$("$clang_format" --dry-run --Werror --style=file "$file" 2>&1)"; then
    if [[ "$output" != *"[-Wclang-format-violations]"* ]]; then
      echo "format.sh: $clang_format failed on $file:" >&2
      echo "$output" >&2
      exit 2
    fi
    unformatted+=("$file")
  fi
done
if [[ ${#unformatted[@]} -gt 0 ]]; then
  echo "format.sh: ${#unformatted[@]} of ${#files[@]} files need formatting (run tools/format.sh):" >&2
  printf '  %s\n' "${unformatted[@]}" >&2
  exit 1
fi
echo "format.sh: all ${#files[@]} files are formatted"
