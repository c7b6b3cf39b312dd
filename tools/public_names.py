#!/usr/bin/env python3
"""Counts the public names a header brings in: what `#include <sac/sac.h>` (or
the header given) declares in namespace sac and its namespaces, outside
`detail` and the floors' internal/ headers, plus the SAC_ macros. Overloads
of a function count once; members do not count (they are reached through
their class), nor do classes only declared (opaque). Uses libclang (pip install libclang) and the include paths of
python3's torch.

  python3 tools/public_names.py [sac/sac.h] [--list] [--max N]
  python3 tools/public_names.py --doors

With --max N it fails (exit 1) when the header brings in more than N names.
--doors counts every door a user includes (DOORS below) and the Python
package's `torch_sac.__all__`, each door by the names it adds to the front
door, and fails when one is over its budget (docs/api.md says why each is
what it is), or when a count written down differs from the one counted:
docs/api.md's table of doors, sac/sac.h's "N names" and docs/install.md's
"declares: N, from M headers". CI runs --doors.
"""
import os
import re
import subprocess
import sys

import clang.cindex as ci

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def torch_includes():
    out = subprocess.check_output(
        ["python3", "-c", "import torch.utils.cpp_extension as e; print('\\n'.join(e.include_paths()))"],
        text=True)
    return out.split()


def gcc_includes():
    err = subprocess.run(["g++", "-xc++", "-E", "-v", "/dev/null"], capture_output=True, text=True).stderr
    lines = err.split("#include <...> search starts here:")[1].split("End of search list.")[0]
    return [line.strip() for line in lines.splitlines() if line.strip()]


def public_file(path):
    path = os.path.realpath(path)
    sac = os.path.join(ROOT, "sac") + os.sep
    return path.startswith(sac) and "/internal/" not in path


KINDS = {
    ci.CursorKind.CLASS_DECL: "class", ci.CursorKind.STRUCT_DECL: "struct",
    ci.CursorKind.CLASS_TEMPLATE: "class", ci.CursorKind.ENUM_DECL: "enum",
    ci.CursorKind.FUNCTION_DECL: "function", ci.CursorKind.FUNCTION_TEMPLATE: "function",
    ci.CursorKind.TYPE_ALIAS_DECL: "alias", ci.CursorKind.TYPEDEF_DECL: "alias",
    ci.CursorKind.VAR_DECL: "variable", ci.CursorKind.TYPE_ALIAS_TEMPLATE_DECL: "alias",
}


def walk(cursor, scope, names):
    for child in cursor.get_children():
        if child.location.file is None or not public_file(child.location.file.name):
            continue
        if child.kind == ci.CursorKind.NAMESPACE:
            if child.spelling in ("detail", "internal", ""):
                continue
            walk(child, scope + [child.spelling], names)
        elif child.kind in KINDS and child.spelling:
            if child.kind in (ci.CursorKind.CLASS_DECL, ci.CursorKind.STRUCT_DECL):
                definition = child.get_definition()
                # A class only declared here (an opaque handle) is no name a
                # user can do anything with; one defined in a detail header
                # is not public either.
                if definition is None or not public_file(definition.location.file.name):
                    continue
            names.add(("::".join(scope + [child.spelling]), KINDS[child.kind]))


# The doors: each header a user includes, and its budget of names beyond the
# front door's (the front door's own, its total). One list: CI and docs/api.md
# read it from here.
DOORS = [
    ("sac/sac.h", 40),
    ("sac/policy/presets.h", 12),
    ("sac/lab.h", 21),
    ("sac/nn/checkpoint_wrapper.h", 4),
    ("sac/nn/apply_activation_checkpointing.h", 4),
    ("sac/nn/checkpoint_sequential.h", 1),
    ("sac/nn/offload_wrapper.h", 4),
    ("sac/nn/fit.h", 2),
]
# All C++ doors together, and the Python package's __all__.
CPP_BUDGET = 82
PYTHON_BUDGET = 50


def parse(header):
    flags = ["-xc++", "-std=c++17", f"-I{ROOT}"]
    flags += [f"-isystem{p}" for p in torch_includes() + gcc_includes()]
    tu = ci.Index.create().parse(os.path.join(ROOT, header), args=flags,
                                 options=ci.TranslationUnit.PARSE_DETAILED_PROCESSING_RECORD)
    errors = [d for d in tu.diagnostics if d.severity >= ci.Diagnostic.Error]
    for d in errors[:5]:
        print("error:", d, file=sys.stderr)
    if errors:
        sys.exit(1)
    names = set()
    for child in tu.cursor.get_children():
        if child.kind == ci.CursorKind.NAMESPACE and child.spelling == "sac":
            walk(child, ["sac"], names)
        elif (child.kind == ci.CursorKind.MACRO_DEFINITION and child.location.file is not None
              and public_file(child.location.file.name) and child.spelling.startswith("SAC_")):
            names.add((child.spelling, "macro"))
    headers = {os.path.relpath(os.path.realpath(i.include.name), ROOT)
               for i in tu.get_includes() if public_file(i.include.name)}
    return names, headers


def python_names():
    import ast
    path = os.path.join(ROOT, "python", "torch_sac", "__init__.py")
    for node in ast.parse(open(path).read()).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and getattr(node.targets[0], "id", None) == "__all__"):
            return ast.literal_eval(node.value)
    sys.exit(f"{path}: no __all__")


def doors():
    front, front_headers = parse(DOORS[0][0])
    everything = set(front)
    counted = {}
    over = []
    print(f"{'door':42} {'names':>5} {'budget':>6}")
    for header, budget in DOORS:
        names, _ = parse(header)
        own = names if header == DOORS[0][0] else names - front
        counted[header] = len(own)
        everything |= names
        print(f"{header:42} {len(own):5} {budget:6}")
        if len(own) > budget:
            over.append(f"{header} adds {len(own)} names, more than its {budget}")
    print(f"{'C++, all doors':42} {len(everything):5} {CPP_BUDGET:6}")
    if len(everything) > CPP_BUDGET:
        over.append(f"the C++ doors together declare {len(everything)}, more than {CPP_BUDGET}")
    py = python_names()
    print(f"{'Python, torch_sac.__all__':42} {len(py):5} {PYTHON_BUDGET:6}")
    if len(py) > PYTHON_BUDGET:
        over.append(f"torch_sac.__all__ has {len(py)} names, more than {PYTHON_BUDGET}")
    for why in over:
        print(why + ": nest what users never name, or raise the budget in tools/public_names.py "
              "and say why in docs/api.md", file=sys.stderr)
    wrong = written_counts(counted, len(everything), len(py), len(front_headers) + 1)
    for why in wrong:
        print(why, file=sys.stderr)
    sys.exit(1 if over or wrong else 0)


def written_counts(counted, cpp_total, python_total, front_headers):
    """Where a page or the front door writes a count down, and it differs
    from the count: one line each."""
    wrong = []
    budgets = dict(DOORS)
    table = open(os.path.join(ROOT, "docs", "api.md")).read()
    rows = {m.group(1): (int(m.group(2)), int(m.group(3))) for m in re.finditer(
        r"^\| `([^`]+)` \|.*\| (\d+) \| (\d+) \|$", table, re.M)}
    expected = {h: (n, budgets[h]) for h, n in counted.items()}
    expected["torch_sac.__all__"] = (python_total, PYTHON_BUDGET)
    for door, numbers in expected.items():
        if rows.get(door) != numbers:
            wrong.append(f"docs/api.md: the row of `{door}` says {rows.get(door)}, "
                         f"the count is {numbers} (names, budget)")
    for door in rows.keys() - expected.keys():
        wrong.append(f"docs/api.md: a row for `{door}`, which is not a door (DOORS)")
    total = re.search(r"^\| all C\+\+ doors together \| \| (\d+) \| (\d+) \|$", table, re.M)
    if total is None or (int(total.group(1)), int(total.group(2))) != (cpp_total, CPP_BUDGET):
        wrong.append(f"docs/api.md: the C++ total row differs from {cpp_total} of {CPP_BUDGET}")
    front = open(os.path.join(ROOT, "sac", "sac.h")).read()
    said = re.search(r"the checkpointing API, (\d+) names", front)
    if said is None or int(said.group(1)) != counted[DOORS[0][0]]:
        wrong.append(f"sac/sac.h: says {said and said.group(1)} names, the count is "
                     f"{counted[DOORS[0][0]]}")
    install = open(os.path.join(ROOT, "docs", "install.md")).read()
    said = re.search(r"declares: (\d+), from (\d+) headers", install)
    if said is None or (int(said.group(1)), int(said.group(2))) != (counted[DOORS[0][0]],
                                                                     front_headers):
        wrong.append(f"docs/install.md: says {said and said.groups()} (names, headers), the "
                     f"count is {(counted[DOORS[0][0]], front_headers)}")
    return wrong


def main():
    argv = sys.argv[1:]
    if "--doors" in argv:
        doors()
    limit = None
    if "--max" in argv:
        at = argv.index("--max")
        limit = int(argv[at + 1])
        del argv[at:at + 2]
    args = [a for a in argv if not a.startswith("--")]
    header = args[0] if args else "sac/sac.h"
    names, headers = parse(header)
    if "--list" in argv:
        for name, kind in sorted(names):
            print(f"{kind:9} {name}")
    print(f"{header}: {len(names)} public names from {len(headers) + 1} sac headers")
    if limit is not None and len(names) > limit:
        print(f"{header} declares {len(names)} public names, more than {limit}: move plumbing to "
              f"an internal/ header, or a feature to a door of its own (see sac/sac.h)",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
