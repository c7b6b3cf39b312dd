#!/usr/bin/env python3
"""One namespace rule for sac's headers:

  * a public header (sac/<floor>/*.h, sac/*.h) declares into `sac`, its one
    public sub-namespace `sac::dispatch` (the mechanism's switch), or, for
    what a public template or class needs but users never name (a base
    class, a forward declaration), `sac::detail`;
  * an internal header (sac/<floor>/internal/*.h) declares into
    `sac::detail` only.

So a name's namespace says whether users may name it: `sac::detail::` never.

  python3 tools/check_namespaces.py      # exit 1, naming each header that breaks it
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PUBLIC = {"sac", "sac::dispatch", "detail", "sac::detail"}
INTERNAL = {"sac::detail"}


def opened(text):
    """The namespaces a header opens, as written (`namespace a::b {`),
    leaving out anonymous ones and those of std and c10 (specializations)."""
    text = re.sub(r"//.*", "", text)
    return [n for n in re.findall(r"^\s*namespace\s+([\w:]+)\s*\{", text, re.M)
            if not n.startswith(("std", "c10", "at", "torch"))]


def main():
    problems = []
    headers = sorted((ROOT / "sac").rglob("*.h"))
    for header in headers:
        internal = header.parent.name == "internal"
        allowed = INTERNAL if internal else PUBLIC
        wrong = [n for n in opened(header.read_text()) if n not in allowed]
        if wrong:
            problems.append(f"{header.relative_to(ROOT)} opens {', '.join(wrong)}; "
                            + ("an internal header declares into sac::detail only"
                               if internal else
                               "a public header declares into sac, sac::dispatch or sac::detail"))
    for problem in problems:
        print(f"check_namespaces.py: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"check_namespaces.py: {len(headers)} headers, one rule: internal/ in sac::detail")
    return 0


if __name__ == "__main__":
    sys.exit(main())
