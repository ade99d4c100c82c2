#!/usr/bin/env python3
"""Resolves every repository path and section cited in gradcomp's docs, headers and sources.

Usage: check_citations.py [ROOT]   (ROOT: the repository, default: two folders above this script)

Exits 0 when every citation resolves, 1 with one line per broken citation (file:line: what is
wrong) otherwise. What it checks, in the files it scans (*.md, C++/CUDA sources and headers,
CMakeLists.txt, *.cmake, *.py, *.sh, .ci/run):

- Markdown links `[text](target)` in *.md files, outside code: a relative target must exist
  (relative to the citing file), and an `#anchor` must be a heading of the target markdown file
  under GitHub's anchor rules (lower case; punctuation other than `-` and `_` dropped; spaces become
  `-`; a repeated heading gets `-1`, `-2`, ...).
- Section citations: `§N` or `§N.M` after a markdown file name (`docs/design.md §2`,
  `wire-format.md §16.2`, `[cuda.md](cuda.md) §4`), and any `§` chained to it by `,`, `and`, `or`
  or a dash (`feedback.md §5 and §8.6`, `quantizers.md §12.3–§12.4`): the file must exist and have a heading
  numbered N (`## N. ...`) or N.M (`### N.M ...`). In a markdown file a `§N` with no file before it
  cites the file itself; in any other file it is an error. A book's chapter-section (`§7-3`) is not
  a citation of the repository.
- Paths: a markdown file name (`design.md`, `docs/cuda.md`), a path under one of the repository's
  top-level folders (`include/...`, `tools/...`, `bench/...`, `tests/...`, ...), an include path
  `gradcomp/....hpp`, and a header named from inside include/gradcomp (`core/concepts.hpp`,
  `cpu/topk.hpp`, `transport/nccl.cuh`; or from the citing file's folder or one above it, as the
  tests name `support/errors.hpp`) must exist. Paths with placeholders (`<device>`, `*`, `...`)
  are checked up to the placeholder's folder.

A bare markdown name resolves against the citing file's folder, then the repository root, then
docs/. URLs are not followed.
"""

from __future__ import annotations

import bisect
import os
import re
import sys
import unicodedata
from pathlib import Path

# Folders of the repository that a bare path may start with.
TOP_FOLDERS = ("include", "tools", "bench", "tests", "examples", "docs", "packaging", "cmake", "test_package", ".ci")
# Libraries whose headers a source names by their include path (CCCL).
EXTERNAL_HEADER_ROOTS = ("cub", "thrust", "nv")
SOURCE_SUFFIXES = (".hpp", ".cuh", ".h", ".cpp", ".cu", ".py", ".sh", ".cmake", ".in")
SOURCE_NAMES = ("CMakeLists.txt", "run")
# Folders never scanned: build trees, VCS data, and the checker's own folder (its fixture and test cite
# a fixture tree on purpose).
SKIP_DIRS = {".git", "build", "__pycache__", "node_modules"}
CHECKER_DIR = Path("tests/docs")

URL = re.compile(r"\b(?:https?|ftp)://[^\s)>\]`'\"]+")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
NUMBERED = re.compile(r"^(\d+(?:\.\d+)*)\.?(?:\s|$)")
MD_LINK = re.compile(r"(?<!!)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^()\s]*)\)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
# A markdown file mention: an optional path, a name, ".md".
MD_NAME = r"(?:[\w.+-]+/)*[\w+-]+\.md"
SECTION = r"§\s?(\d+(?:\.\d+)*)(?![\d-]*\d)"
CHAIN_SEP = r"(?:\s*(?:,|and|or|–|—|-|to)\s*)"
# A file (plain, or as a markdown link with an optional anchor), then a § chain.
CITED_SECTION = re.compile(
    r"(?:\[[^\]]*\]\((" + MD_NAME + r")(?:#[^)]*)?\)|(?<![\w/.-])(" + MD_NAME + r"))\)?,?\s+" + SECTION)
ANY_SECTION = re.compile(SECTION)
CHAINED = re.compile(CHAIN_SEP + SECTION)
PATH = re.compile(r"(?<![\w./$-])((?:" + "|".join(re.escape(f) for f in TOP_FOLDERS) + r")/[\w./+-]*)")
INCLUDE_PATH = re.compile(r"(?<![\w./-])gradcomp/([\w/]+\.(?:hpp|cuh))\b")
BARE_MD = re.compile(r"(?<![\w./-])(" + MD_NAME + r")(?![\w/])")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading's text (before duplicates get their -N suffix)."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    out = []
    for ch in text.lower():
        cat = unicodedata.category(ch)
        if ch in "-_" or cat[0] in "LN" or cat == "Mn":
            out.append(ch)
        elif ch == " ":
            out.append("-")
    return "".join(out)


class Markdown:
    """Headings of one markdown file: the GitHub anchors and the section numbers."""

    def __init__(self, path: Path):
        self.anchors: set[str] = set()
        self.sections: set[str] = set()
        seen: dict[str, int] = {}
        in_fence = False
        for line in path.read_text(encoding="utf-8").splitlines():
            if FENCE.match(line):
                in_fence = not in_fence
                continue
            m = None if in_fence else HEADING.match(line)
            if not m:
                continue
            text = m.group(2)
            base = github_anchor(text)
            n = seen.get(base, 0)
            seen[base] = n + 1
            self.anchors.add(base if n == 0 else f"{base}-{n}")
            num = NUMBERED.match(text)
            if num:
                self.sections.add(num.group(1))


class Checker:
    def __init__(self, root: Path):
        self.root = root.resolve()
        self.errors: list[str] = []
        self._markdown: dict[Path, Markdown] = {}
        self.citations = 0

    # ---- resolution ---------------------------------------------------------------------------
    def markdown(self, path: Path) -> Markdown:
        if path not in self._markdown:
            self._markdown[path] = Markdown(path)
        return self._markdown[path]

    def exists(self, rel: str) -> bool:
        return (self.root / rel).exists()

    def resolve_md(self, name: str, citing: Path) -> Path | None:
        """A markdown name against the citing file's folder, the root, then docs/."""
        for base in (citing.parent, self.root, self.root / "docs"):
            candidate = (base / name).resolve()
            if candidate.is_file() and self.root in candidate.parents:
                return candidate
        return None

    def report(self, citing: Path, line: int, message: str) -> None:
        self.errors.append(f"{citing.relative_to(self.root).as_posix()}:{line}: {message}")

    # ---- scanning -----------------------------------------------------------------------------
    def files(self):
        for dirpath, dirnames, filenames in os.walk(self.root):
            rel_dir = Path(dirpath).relative_to(self.root)
            dirnames[:] = sorted(
                d for d in dirnames
                if d not in SKIP_DIRS and not d.startswith("build") and (not d.startswith(".") or d == ".ci")
                and rel_dir / d != CHECKER_DIR)
            for name in sorted(filenames):
                path = Path(dirpath) / name
                if name.endswith(".md") or name.endswith(SOURCE_SUFFIXES) or name in SOURCE_NAMES:
                    if name == "run" and rel_dir != Path(".ci"):
                        continue
                    yield path

    def check_all(self) -> list[str]:
        for path in self.files():
            self.check_file(path)
        return self.errors

    def check_file(self, path: Path) -> None:
        is_md = path.suffix == ".md"
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        # The text as one string (comment markers stripped, so that a citation may wrap), with the
        # offset where each line starts; markdown code fences are kept for paths only.
        pieces, starts, prose, offset, in_fence = [], [], [], 0, False
        for line in lines:
            fence = is_md and FENCE.match(line)
            if fence:
                in_fence = not in_fence
            text = line if is_md else re.sub(r"^\s*(?:///?|#|\*|/\*\*?|--)\s?", "", line)
            text = URL.sub(" ", text)
            starts.append(offset)
            pieces.append(text)
            prose.append(" " * len(text) if (in_fence or fence) else text)
            offset += len(text) + 1
        joined = "\n".join(pieces)
        joined_prose = "\n".join(prose)
        if not is_md:
            joined = joined.replace("\n", " ")
            joined_prose = joined
        line_of = lambda pos: bisect.bisect_right(starts, pos)

        bound: set[int] = set()
        if is_md:
            # Inline code: no links in it, but its paths and sections count.
            link_text = INLINE_CODE.sub(lambda m: " " * len(m.group(0)), joined_prose)
            for m in MD_LINK.finditer(link_text):
                self.check_link(path, line_of(m.start()), m.group(2))
                # A § in a link's text cites the link's file (the file itself for a bare #anchor).
                file_part = m.group(2).partition("#")[0]
                if re.match(r"^[a-z][a-z+.-]*:", m.group(2)) or (file_part and not file_part.endswith(".md")):
                    continue
                md = (path.parent / file_part).resolve() if file_part else path
                for s in ANY_SECTION.finditer(joined_prose, m.start(1), m.end(1)):
                    bound.add(s.start(1))
                    if md.is_file():
                        self.check_section(path, line_of(s.start(1)), md, s.group(1), file_part or "this file's")

        self.check_sections(path, joined_prose, is_md, line_of, bound)
        if is_md:  # a link's target was checked as a link
            for m in MD_LINK.finditer(link_text):
                joined = joined[:m.start(2)] + " " * len(m.group(2)) + joined[m.end(2):]
        self.check_paths(path, joined, line_of)

    def check_link(self, citing: Path, line: int, target: str) -> None:
        if not target or re.match(r"^[a-z][a-z+.-]*:", target):
            return
        self.citations += 1
        file_part, _, anchor = target.partition("#")
        dest = citing if not file_part else (citing.parent / file_part).resolve()
        if file_part and (not dest.exists() or self.root not in dest.parents and dest != self.root):
            self.report(citing, line, f"link to missing file '{target}'")
            return
        if anchor and dest.suffix == ".md" and anchor not in self.markdown(dest).anchors:
            self.report(citing, line, f"link to missing anchor '#{anchor}' in {dest.relative_to(self.root).as_posix()}")

    def check_section(self, citing: Path, line: int, md: Path, number: str, cited_as: str) -> None:
        self.citations += 1
        if number not in self.markdown(md).sections:
            self.report(citing, line, f"{cited_as} §{number}: no heading numbered {number} in "
                        f"{md.relative_to(self.root).as_posix()}")

    def check_sections(self, citing: Path, text: str, is_md: bool, line_of, bound: set[int]) -> None:
        for m in CITED_SECTION.finditer(text):
            name = m.group(1) or m.group(2)
            md = self.resolve_md(name, citing)
            pos = m.start(3)
            numbers = [(pos, m.group(3))]
            end = m.end()
            while (c := CHAINED.match(text, end)):
                numbers.append((c.start(1), c.group(1)))
                end = c.end()
            for p, number in numbers:
                if p in bound:
                    continue
                bound.add(p)
                if md is not None:  # a missing file is reported once, by check_paths
                    self.check_section(citing, line_of(p), md, number, name)
        # Unbound §: the markdown file itself, chained like above; an error elsewhere.
        for m in ANY_SECTION.finditer(text):
            if m.start(1) in bound:
                continue
            numbers = [(m.start(1), m.group(1))]
            end = m.end()
            while (c := CHAINED.match(text, end)):
                numbers.append((c.start(1), c.group(1)))
                end = c.end()
            for p, number in numbers:
                if p in bound:
                    continue
                bound.add(p)
                if is_md:
                    self.check_section(citing, line_of(p), citing, number, "this file's")
                else:
                    self.report(citing, line_of(p), f"§{number} names no file (write docs/<file>.md §{number})")

    def check_paths(self, citing: Path, text: str, line_of) -> None:
        for m in PATH.finditer(text):
            rel = m.group(1).rstrip(".")
            # Up to a placeholder ('<device>', '*', '...', '{a,b}'): the folder that holds it.
            if re.search(r"[<*{]|\.\.\.", text[m.end(1):m.end(1) + 1]) or "..." in rel:
                rel = rel.split("...")[0]
                rel = rel[: rel.rfind("/") + 1] if not rel.endswith("/") else rel
            rel = rel.rstrip("/")
            if "/" not in rel and rel in TOP_FOLDERS and not text[m.end(1) - 1:m.end(1)] == "/":
                continue
            self.citations += 1
            if not self.exists(rel) and not (citing.parent / rel).exists():
                self.report(citing, line_of(m.start(1)), f"path '{m.group(1)}' does not exist")
        for m in INCLUDE_PATH.finditer(text):
            self.citations += 1
            if not self.exists(f"include/gradcomp/{m.group(1)}"):
                self.report(citing, line_of(m.start()), f"header 'gradcomp/{m.group(1)}' does not exist")
        for m in re.finditer(r"(?<![\w./$-])((?:[a-z_]+/)+[\w]+\.(?:hpp|cuh))\b", text):
            rel = m.group(1)
            if rel.split("/")[0] in TOP_FOLDERS or rel.startswith("gradcomp/"):
                continue
            self.citations += 1
            if rel.split("/")[0] in EXTERNAL_HEADER_ROOTS or rel.startswith("cuda/std/"):
                continue
            # include/gradcomp, the citing file's folders, and tests/ (the include folder of the
            # tests' support headers, which bench/ and examples/ use too).
            if not (self.exists(f"include/gradcomp/{rel}") or self.exists(f"tests/{rel}")
                    or any((d / rel).exists() for d in citing.parents)):
                self.report(citing, line_of(m.start(1)), f"header '{rel}' is not in include/gradcomp")
        for m in BARE_MD.finditer(text):
            name = m.group(1)
            if "/" in name and name.split("/")[0] in TOP_FOLDERS:
                continue  # checked as a path above
            self.citations += 1
            if self.resolve_md(name, citing) is None:
                self.report(citing, line_of(m.start(1)), f"markdown file '{name}' is not in the repository")


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[2]
    checker = Checker(root)
    errors = sorted(set(checker.check_all()))
    if errors:
        print(f"{len(errors)} broken citation(s) under {checker.root}:")
        for e in errors:
            print("  " + e)
        return 1
    print(f"all {checker.citations} citations resolve under {checker.root}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
