#!/usr/bin/env python3
"""Tests check_citations.py: on fixture/, which holds good citations and broken ones of every kind,
it must report exactly the broken ones (fixture/expected.txt) and fail; on a copy of the fixture with
the broken ones removed it must pass; its anchors must be GitHub's."""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here))
from check_citations import github_anchor  # noqa: E402

failures = []


def check(condition, what):
    if not condition:
        failures.append(what)


def run(root):
    p = subprocess.run([sys.executable, str(here / "check_citations.py"), str(root)], capture_output=True, text=True)
    return p.returncode, p.stdout


# GitHub's anchors for headings of the repository's docs (as GitHub renders them).
for heading, anchor in [
    ("11. Sign quantizer (`sign_quantizer<T>`)", "11-sign-quantizer-sign_quantizert"),
    ("`topk_sparsifier<T = float>` (`sparsify/topk.hpp`)", "topk_sparsifiert--float-sparsifytopkhpp"),
    ("5. Errors (`core/error.hpp`)", "5-errors-coreerrorhpp"),
    ("8. Deadlines: a rank that dies or stops calling", "8-deadlines-a-rank-that-dies-or-stops-calling"),
    ("1.2 Fixes to the reference code", "12-fixes-to-the-reference-code"),
    ("Packages: CMake, pkg-config, Conan and vcpkg", "packages-cmake-pkg-config-conan-and-vcpkg"),
]:
    check(github_anchor(heading) == anchor, f"anchor of {heading!r}: {github_anchor(heading)!r}, expected {anchor!r}")

# The fixture: every broken citation reported, with its line, and nothing else.
rc, out = run(here / "fixture")
reported = [line.strip() for line in out.splitlines()[1:]]
expected = (here / "fixture" / "expected.txt").read_text().splitlines()
check(rc == 1, f"exit status {rc} on the broken fixture, expected 1")
check(out.startswith(f"{len(expected)} broken citation(s)"), f"first line: {out.splitlines()[:1]}")
for e in expected:
    check(e in reported, f"not reported: {e}")
for r in reported:
    check(r in expected, f"reported but not broken: {r}")

# The same tree with the broken citations removed passes.
with tempfile.TemporaryDirectory() as tmp:
    clean = Path(tmp) / "fixture"
    shutil.copytree(here / "fixture", clean)
    readme = clean / "README.md"
    readme.write_text(readme.read_text().split("\nBroken:")[0] + "\n")
    guide = clean / "docs" / "guide.md"
    guide.write_text(guide.read_text().replace(", and §7 (not in this file)", ""))
    header = clean / "include" / "gradcomp" / "core" / "present.hpp"
    header.write_text("\n".join(header.read_text().splitlines()[:3]).replace("  Broken: docs/guide.md §5, wrapped docs/guide.md", "") + "\n")
    rc, out = run(clean)
    check(rc == 0 and out.startswith("all "), f"the fixture without its broken citations fails:\n{out}")

if failures:
    print(f"{len(failures)} failure(s):")
    for f in failures:
        print("  " + f)
    sys.exit(1)
print(f"check_citations.py: {len(expected)} broken citations of the fixture reported, the clean copy passes, anchors as GitHub's")
