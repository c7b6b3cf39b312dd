"""The site's user pages read as a guide: at most 20 words per sentence on
average, and no test names (what a test proves is linked, not narrated).

  python3 tools/check_docs.py            # the check CI runs
  python3 tools/check_docs.py --all      # every page's average, checked or not

A sentence is prose outside code blocks, tables and HTML comments, ended by
'.', '?' or '!' before a space or the line's end; a list item or a
heading without one ends at its line. Inline code counts as one word.
The pages in CONTRIBUTOR_PAGES describe the suite and CI for those who change
sac: they are measured, not checked."""
import argparse
import glob
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DOCS = os.path.join(ROOT, "docs")
MOST_WORDS = 20
# Pages for those who change sac, not use it: they name tests on purpose.
CONTRIBUTOR_PAGES = {"testing.md"}
# A test's name: a Python test function, a GoogleTest suite's test, a test file.
TEST_NAME = re.compile(r"\btest_[a-z0-9_]+|\bTEST(_F|_P)?\(|\b[a-z0-9_]+_test\.(cpp|py)\b")


def prose(text):
    """The page's prose lines: code blocks, tables, comments and directives out."""
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"^(```|~~~).*?^\1\s*$", "", text, flags=re.S | re.M)
    return [line for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith(("|", ":"))]


def sentences(text):
    """Sentences, each a list of words."""
    out, current = [], []
    for line in prose(text):
        line = re.sub(r"`[^`]*`", "CODE", line)
        line = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", line)
        starts_item = re.match(r"\s*([-*+]|\d+\.|#+)\s", line)
        if starts_item and current:
            out.append(current)
            current = []
        line = re.sub(r"^\s*([-*+]|\d+\.|#+)\s", "", line)
        for piece in re.split(r"(?<=[.?!])\s+", line.strip()):
            current += piece.split()
            if re.search(r"[.?!]$", piece):
                out.append(current)
                current = []
        if starts_item and line.lstrip().startswith("#"):
            out.append(current)
            current = []
    if current:
        out.append(current)
    return [s for s in out if s]


def pages():
    return sorted(os.path.relpath(p, DOCS) for p in glob.glob(os.path.join(DOCS, "**", "*.md"),
                                                                  recursive=True))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="print every page's average")
    args = parser.parse_args()
    failures = []
    for page in pages():
        with open(os.path.join(DOCS, page)) as f:
            text = f.read()
        found = sentences(text)
        average = sum(map(len, found)) / max(1, len(found))
        checked = page not in CONTRIBUTOR_PAGES
        if args.all:
            print(f"{page:32} {len(found):4} sentences, {average:5.1f} words on average"
                  f"{'' if checked else '  (contributors)'}")
        if not checked:
            continue
        if average > MOST_WORDS:
            failures.append(f"docs/{page}: {average:.1f} words per sentence on average, over "
                            f"{MOST_WORDS}; split the longest sentences (one claim each)")
        for name in sorted({m.group(0) for m in TEST_NAME.finditer("\n".join(prose(text)))}):
            failures.append(f"docs/{page}: names the test {name!r}; a user page links what a "
                            "test proves, and does not narrate it")
    for page in CONTRIBUTOR_PAGES:
        if not os.path.exists(os.path.join(DOCS, page)):
            failures.append(f"tools/check_docs.py: CONTRIBUTOR_PAGES names docs/{page}, "
                            "which does not exist")
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
