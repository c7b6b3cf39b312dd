#!/usr/bin/env python3
"""Counts the public names a header brings in: what `#include <sac/sac.h>` (or
the header given) declares in namespace sac and its namespaces, outside
`detail` and the floors' internal/ headers, plus the SAC_ macros. Overloads
of a function count once; members do not count (they are reached through
their class), nor do classes only declared (opaque). Uses libclang (pip install libclang) and the include paths of
python3's torch.

  python3 tools/public_names.py [sac/sac.h] [--list] [--max N]

With --max N it fails (exit 1) when the header brings in more than N names:
CI keeps sac/sac.h, the front door, at 40 or fewer.
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


def main():
    argv = sys.argv[1:]
    limit = None
    if "--max" in argv:
        at = argv.index("--max")
        limit = int(argv[at + 1])
        del argv[at:at + 2]
    args = [a for a in argv if not a.startswith("--")]
    header = args[0] if args else "sac/sac.h"
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
