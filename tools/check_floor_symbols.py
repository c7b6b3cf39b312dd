#!/usr/bin/env python3
"""The floors, checked by symbol: each floor's object files define sac's
symbols, and use only those of their own floor and the floors below it.
The include check (cmake/check_floors.cmake, Bazel's deps) misses a call up
a floor through a declaration written locally; the linker would take it,
since libsac is all the floors at once. This reads the objects with nm.

  python3 tools/check_floor_symbols.py [BUILD_DIR]   # default: build

The floors and what each stands on come from CMakeLists.txt, as
tools/check_floors.py reads them."""
import pathlib
import subprocess
import sys

from check_floors import ROOT, cmake


def symbols(objects, *flags):
    """The mangled sac symbols that `objects` define (or use, with -u)."""
    if not objects:
        return set()
    out = subprocess.run(["nm", "--format=posix", *flags, *map(str, objects)],
                         capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        parts = line.split()
        # A defined symbol's type is neither undefined (U) nor weak undefined.
        if len(parts) >= 2 and parts[0].startswith(("_ZN3sac", "_ZNK3sac")) and (
                "-u" in flags or parts[1] not in ("U", "w", "v")):
            found.add(parts[0])
    return found


def demangle(symbol):
    return subprocess.run(["c++filt", symbol], capture_output=True, text=True).stdout.strip()


def main():
    build = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "build")
    floors = cmake()
    below = {}
    for floor, stands_on in floors:
        reach = set(stands_on)
        pending = list(stands_on)
        while pending:
            for lower in dict(floors)[pending.pop()]:
                if lower not in reach:
                    reach.add(lower)
                    pending.append(lower)
        below[floor] = reach
    objects = {floor: sorted((build / "CMakeFiles" / f"sac_{floor}.dir").rglob("*.o"))
               for floor, _ in floors}
    missing = [floor for floor, found in objects.items() if not found]
    if missing:
        sys.exit(f"tools/check_floor_symbols.py: no objects for {', '.join(missing)} under "
                 f"{build}: build sac first (bash .ci/build)")
    defined_by = {}
    for floor, found in objects.items():
        for symbol in symbols(found, "--defined-only"):
            defined_by.setdefault(symbol, floor)
    problems = []
    for floor, found in objects.items():
        for symbol in sorted(symbols(found, "-u")):
            owner = defined_by.get(symbol)
            if owner is not None and owner != floor and owner not in below[floor]:
                problems.append(f"sac/{floor} uses {demangle(symbol)}, defined in sac/{owner}, "
                                f"which sac/{floor} does not stand on")
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"tools/check_floor_symbols.py: {len(defined_by)} sac symbols in {len(floors)} floors, "
          f"{len(problems)} used up a floor")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
