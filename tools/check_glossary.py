#!/usr/bin/env python3
"""docs/glossary.md names code: each term's *Code:* line; docs/renamed.md, its
history, the Renamed table's new names and retired ones, and the rows of
Still to rename (a file, and what it says now).
A rename that forgets the glossary leaves it naming what no longer exists,
and a row done but not struck off sends the next reader to nothing. This
checks that every file the glossary names exists, that every identifier a
*Code:* line or the Renamed table names occurs in the tree (in the files the
same line names, where it names any), that no retired identifier of the
Renamed table is left in code or docs, and that every Still to rename row's
"now" still occurs in its file.

  python3 tools/check_glossary.py      # exit 1, listing what it did not find
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
GLOSSARY = ROOT / "docs/glossary.md"
RENAMED = ROOT / "docs/renamed.md"
SEARCHED = ["sac", "python", "tests", "benchmarks", "examples", "tools", "cmake", "bazel", ".ci",
            "CMakeLists.txt", "BUILD.bazel", "README.md", "BENCHMARKS.md", "docs"]
SUFFIXES = {".h", ".cpp", ".py", ".pyi", ".md", ".cmake", ".txt", ".bazel", ".bzl", ".sh", ""}

PATH = re.compile(r"^[\w.-]+(/[\w.*-]+)+(#[\w-]+)?$|^[\w-]+\.(h|cpp|py|md|cmake|txt|bazel)$")
IDENTIFIER = re.compile(r"^(enum class |struct |class )?(~?[A-Za-z_][\w:~]*\*?)(\(.*\))?$")


def tree_files():
    for name in SEARCHED:
        path = ROOT / name
        if path.is_file():
            yield path
        elif path.is_dir():
            yield from (p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES
                        and "__pycache__" not in p.parts)


TEXTS = {p: p.read_text(errors="replace") for p in tree_files() if p not in (GLOSSARY, RENAMED)}
# Where identifiers are looked for when the glossary names no file: code,
# not prose (the docs may still say an old name).
CODE = [p for p in TEXTS if p.suffix not in (".md", ".txt") or p.name == "CMakeLists.txt"]


def occurs(word, files):
    pattern = re.compile(
        r"(?<![\w])" + re.escape(word).replace(r"\*", r"\w*") + r"(?![\w])")
    return any(pattern.search(TEXTS.get(f, "")) for f in files)


def retired_identifier(token):
    """Whether a Was cell's token is code to look for: a path, or an
    identifier with `::`, `_` or a capital (plain words stay in prose)."""
    name = re.sub(r"\(.*\)$", "", token).strip()
    if "/" in name:
        return True
    return bool(IDENTIFIER.match(name)) and bool(
        "::" in name or "_" in name.strip("_") or re.search(r"[a-z][A-Z]|^[A-Z][a-z]+[A-Z]", name))


def where_it_occurs(token):
    """The files that still use `token`: in code as a word, in docs as code
    (between backticks)."""
    name = re.sub(r"\(.*\)$", "", token).strip()
    word = re.compile(r"(?<![\w])" + re.escape(name) + r"(?![\w])")
    quoted = re.compile(r"`[^`\n]*(?<![\w])" + re.escape(name) + r"(?![\w])[^`\n]*`")
    return [str(p.relative_to(ROOT)) for p, t in TEXTS.items()
            if (quoted if p.suffix == ".md" else word).search(t)]


def flowing(text):
    """Text with comments' line breaks and markers gone, so that a phrase
    quoted from a comment matches across the lines it wraps over."""
    return re.sub(r"\s*\n\s*(//+|#+|\*+)?\s*", " ", text)


def resolve(path, where):
    """The files a glossary path names: from the root, or beside a file named
    on the same line (`producers.h` after `sac/cache/internal/...`)."""
    path = path.split("#")[0]
    candidates = [ROOT / path] + [ROOT / "docs" / path] + [p.parent / path for p in where]
    for candidate in candidates:
        matches = sorted(candidate.parent.glob(candidate.name)) if "*" in path else (
            [candidate] if candidate.exists() else [])
        if matches:
            return matches
    return []


def check_identifiers(tokens, where, context, problems):
    """Each identifier occurs in a file the line names or, failing that, in
    the code: a qualified one's last part in a file that names its first."""
    for token in tokens:
        match = IDENTIFIER.match(token)
        if not match:
            continue
        parts = [p for p in match.group(2).split("::") if p not in ("sac", "")]
        if all(occurs(part, where) for part in parts):
            continue
        holders = [f for f in CODE if occurs(parts[0], [f])]
        if not all(occurs(part, holders) for part in parts[1:]) or not holders:
            problems.append(f"{context}: `{token}` is not in the code"
                            + (" nor in " + ", ".join(str(f.relative_to(ROOT)) for f in where)
                               if where else ""))


def paragraphs_of_code(text):
    """Each *Code:* line with what follows it up to the next *Not*/*Say* or
    blank line, and its line number."""
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        if line.startswith("*Code:*"):
            body = [line]
            for following in lines[number:]:
                if not following.strip() or re.match(r"^\*(Not|Say)", following):
                    break
                body.append(following)
            yield number, " ".join(body)


def main():
    text = GLOSSARY.read_text()
    problems = []
    # *Code:* lines: files exist; identifiers occur in the files named.
    for number, paragraph in paragraphs_of_code(text):
        tokens = re.findall(r"`([^`]+)`", paragraph)
        where, missing = [], False
        for token in tokens:
            if PATH.match(token):
                found = resolve(token, where)
                if not found:
                    problems.append(f"glossary.md:{number}: `{token}` does not exist")
                    missing = True
                where += found
        if not missing:
            check_identifiers([t for t in tokens if not PATH.match(t)], where,
                              f"glossary.md:{number}", problems)
    # Renamed: the new names exist, and the retired identifiers are gone.
    text = RENAMED.read_text()
    table = text[:text.index("## Still to rename")]
    # A Was token that a Now cell uses, or that names whose part was renamed
    # (`OpCache`'s ...), stays in a meaning of its own.
    now_cells = " ".join(row.split(" | ")[1] for row in table.splitlines()
                         if row.startswith("| `") and len(row.split(" | ")) >= 3)
    for number, row in enumerate(table.splitlines(), 1):
        cells = row.split(" | ")
        if row.startswith("| `") and len(cells) >= 3:
            check_identifiers(re.findall(r"`([^`]+)`", cells[1]), [],
                              f"renamed.md:{number} (Renamed)", problems)
            for old in re.findall(r"`([^`]+)`(?!'s)", cells[0]):
                if retired_identifier(old) and old.rstrip("()") not in now_cells \
                        and where_it_occurs(old):
                    problems.append(f"renamed.md:{number}: the retired `{old}` is still in "
                                    f"{', '.join(where_it_occurs(old))}")
    # Still to rename: each row's file exists and still says what it says.
    start = text.index("## Still to rename")
    for number, row in enumerate(text[start:].splitlines(), text[:start].count("\n") + 1):
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        path = re.match(r"`([^`:]+)", cells[0]).group(1)
        found = resolve(path, [])
        if not found:
            problems.append(f"glossary.md:{number}: `{path}` does not exist")
            continue
        now = re.findall(r"`([^`]+)`", cells[1]) or re.findall(r'"([^"]+?)(?:\.\.\.)?"', cells[1])
        for phrase in now:
            words = " ".join(phrase.split("::")[-1].rstrip("()").split())
            if words not in flowing(TEXTS.get(found[0], "")) and not occurs(words, found):
                problems.append(f"renamed.md:{number}: {path} no longer says `{phrase}` "
                                "(renamed? strike the row)")
    for problem in problems:
        print(f"check_glossary.py: {problem}", file=sys.stderr)
    if problems:
        print(f"check_glossary.py: {len(problems)} problems: the glossary names code that "
              "is not there. Fix the entry or the row.", file=sys.stderr)
        return 1
    print("check_glossary.py: every file and identifier the glossary names is there")
    return 0


if __name__ == "__main__":
    sys.exit(main())
