#!/usr/bin/env python3
"""Checks that every `Note [Title]` the tree mentions is written once.

A note is written where a comment line of code (not docs/) starts with it:
`// Note [Title]` alone on its line, or followed by a colon and its text. Anything else that names `Note [Title]`
(code, tests, docs) refers to it, and must name a note that is written, or a
reader follows it to nothing. The Renamed page's tables name old titles on
purpose (what was renamed to what): their rows are not references.

  python3 tools/check_notes.py [--list]

Exits 1, listing each reference to an unwritten note and each note written
twice; with --list, prints every note and how often it is referred to.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFINITION = re.compile(r"\s*(?://|#)\s*Note \[([^\]]+)\](?::|\s*$)")
REFERENCE = re.compile(r"Note \[([^\]]+)\]")


def tracked_text_files():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    for path in files:
        try:
            with open(os.path.join(ROOT, path), encoding="utf-8") as f:
                yield path, f.read().splitlines()
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue  # binary files (images), submodules


def main():
    written, references = {}, []
    for path, lines in tracked_text_files():
        if path == "tools/check_notes.py":
            continue
        for number, line in enumerate(lines, 1):
            where = f"{path}:{number}"
            definition = DEFINITION.match(line)
            if definition and not path.endswith(".md"):
                written.setdefault(definition.group(1), []).append(where)
                continue
            if path == "docs/renamed.md" and line.startswith("|"):
                continue
            references += [(m.group(1), where) for m in REFERENCE.finditer(line)
                           if m.group(1) != "..."]
    problems = [f"{where}: refers to Note [{title}], which no comment of the code writes"
                for title, where in references if title not in written]
    problems += [f"Note [{title}] is written {len(places)} times: {', '.join(places)}"
                 for title, places in written.items() if len(places) > 1]
    if "--list" in sys.argv:
        for title, places in sorted(written.items()):
            count = sum(1 for t, _ in references if t == title)
            print(f"{count:3d} references  Note [{title}]  ({places[0]})")
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"check_notes.py: {len(written)} notes, {len(references)} references, "
          f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
