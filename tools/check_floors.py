#!/usr/bin/env python3
"""The floors under sac/ are drawn three times: CMakeLists.txt
(SAC_FLOORS, SAC_STANDS_ON_<floor>), BUILD.bazel (SAC_FLOORS) and the layout
table of docs/install.md. Each build enforces its own drawing (an include
that runs up a floor fails), so a drawing that differs lets one build accept
what the other refuses. This checks that the three name the same floors, in
the same order, each standing on the same floors, and that every folder
under sac/ is one of them.

  python3 tools/check_floors.py      # exit 1, saying where they differ
"""
import ast
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def cmake():
    text = (ROOT / "CMakeLists.txt").read_text()
    order = re.search(r"^set\(SAC_FLOORS ([^)]*)\)", text, re.M).group(1).split()
    stands_on = {}
    for floor, below in re.findall(r'^set\(SAC_STANDS_ON_(\w+) ([^)]*)\)', text, re.M):
        stands_on[floor] = [] if below.strip() == '""' else below.split()
    return [(floor, stands_on.get(floor)) for floor in order]


def bazel():
    tree = ast.parse((ROOT / "BUILD.bazel").read_text())
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "SAC_FLOORS"):
            return list(ast.literal_eval(node.value).items())
    raise SystemExit("check_floors.py: BUILD.bazel assigns no SAC_FLOORS dict")


def docs():
    rows = []
    for line in (ROOT / "docs/install.md").read_text().splitlines():
        match = re.match(r"\| `sac/(\w+)/` \|.*\| ([^|]*) \|$", line)
        if match:
            below = match.group(2).strip()
            rows.append((match.group(1),
                         [] if below == "-" else [b.strip() for b in below.split(",")]))
    return rows


def main():
    drawings = {"CMakeLists.txt": cmake(), "BUILD.bazel": bazel(),
                "docs/install.md's layout table": docs()}
    folders = sorted(p.name for p in (ROOT / "sac").iterdir() if p.is_dir())
    problems = []
    reference_name, reference = next(iter(drawings.items()))
    for name, drawing in drawings.items():
        if sorted(floor for floor, _ in drawing) != folders:
            problems.append(f"{name} draws the floors {[f for f, _ in drawing]}; the folders "
                            f"under sac/ are {folders}")
        if drawing != reference:
            problems.append(f"{name} draws {drawing}\n  but {reference_name} draws {reference}")
    for problem in problems:
        print(f"check_floors.py: {problem}", file=sys.stderr)
    if problems:
        print("check_floors.py: draw the floors the same in CMakeLists.txt, BUILD.bazel and "
              "docs/install.md (floor by floor, in the same order, each with the floors it "
              "stands on).", file=sys.stderr)
        return 1
    print(f"check_floors.py: {len(reference)} floors, drawn alike in {len(drawings)} places")
    return 0


if __name__ == "__main__":
    sys.exit(main())
