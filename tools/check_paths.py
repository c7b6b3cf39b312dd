"""Every repository path that the tree names exists: in comments, docs,
scripts and build files, a path under one of the tree's top folders (sac/,
tests/, docs/, tools/, .ci/, ...) must name a file or folder that is there.

  python3 tools/check_paths.py

A path may end in a glob (`sac/*/internal/`) or a placeholder in capitals or
angle brackets (`docs/NAME.md`, `build/...`): those are skipped, as are build
outputs (build/, build-*/) and paths inside another repository (PyTorch's
`torch/csrc/...`)."""
import os
import re
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
TOP = ["sac", "tests", "docs", "tools", ".ci", "benchmarks", "examples", "python", "bazel",
       "cmake"]
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./*-]*[\w*/])" % "|".join(re.escape(t) for t in TOP))
# Words after which a path is another repository's (PyTorch's own tests, ...).
ELSEWHERE = re.compile(r"(pytorch|torch|PyTorch|torchtitan|transformers|jax)[/ ]$", re.I)


# Paths a build makes, named where they are made.
MADE = {"tests/readme_example_test.cpp": "BUILD.bazel's genrule writes it from README.md"}
# Pages that keep history: the names they list were retired on purpose.
HISTORY = {"docs/renamed.md"}


def tracked():
    return subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                          cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()


def built(path, present):
    """A program or library the build makes from a source of that name."""
    stem = re.sub(r"^(.*/)lib(sac_)?(.*)\.so$", r"\1\3", path)
    return stem + ".cpp" in present


def skipped(path):
    return ("*" in path or "..." in path or "<" in path
            or re.search(r"/[A-Z][A-Z_]+(?=[._/]|$)", path))


def main():
    present = set(tracked())
    files = [f for f in sorted(present) if not f.endswith((".png", ".whl"))
             and f not in HISTORY]
    folders = {os.path.dirname(f) for f in files}
    while True:
        parents = {os.path.dirname(d) for d in folders} - folders
        if not parents - {""}:
            break
        folders |= parents
    failures = []
    for name in files:
        try:
            with open(os.path.join(ROOT, name), encoding="utf-8") as f:
                lines = f.readlines()
        except (UnicodeDecodeError, IsADirectoryError):
            continue
        for number, line in enumerate(lines, 1):
            for match in PATH.finditer(line):
                path = match.group(1).rstrip("./")
                if skipped(path) or ELSEWHERE.search(line[:match.start()]):
                    continue
                if path not in present and path not in folders and path not in MADE \
                        and not built(path, present):
                    failures.append(f"{name}:{number}: names {path}, which is not in the tree")
    for failure in failures:
        print(failure, file=sys.stderr)
    print(f"tools/check_paths.py: {len(files)} files read, {len(failures)} paths missing")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
