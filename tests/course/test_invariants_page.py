"""book/src/invariants.md: every invariant names tests, and every test it names exists.

The page lists each invariant as a `### ` heading, followed by the tests that check it as
`path/to/test_file.py::test_name` (or `::TestClass`, `::TestClass::test_method`). A test
"exists" when its file defines it: a top-level function, a class (a hypothesis state
machine's `TestX = Machine.TestCase` included), or a method of a class; the files are
parsed, not imported. The Phase 05 section holds at least as many invariants as the
chapter's "The six invariants" list has items.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "book" / "src" / "invariants.md"
TEST_ID = re.compile(r"`((?:tests|labs)/[\w./-]+\.py)::([\w:]+)(?:\[[^\]`]*\])?`")


def sections() -> list[tuple[str, str, str]]:
    """(phase heading, invariant heading, body) for each `### ` section of the page."""
    found, phase = [], ""
    text = re.sub(r"^```.*?^```", "", PAGE.read_text(encoding="utf-8"), flags=re.S | re.M)
    for block in re.split(r"^(?=##+ )", text, flags=re.M):
        heading = block.split("\n", 1)[0]
        if heading.startswith("## "):
            phase = heading[3:].strip()
        elif heading.startswith("### "):
            found.append((phase, heading[4:].strip(), block))
    return found


@cache
def defined_names(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(f"{node.name}::{item.name}")
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return frozenset(names)


def test_the_page_lists_invariants():
    assert len(sections()) >= 20, f"{PAGE.relative_to(ROOT)} lists fewer than 20 invariants"


def test_every_invariant_names_at_least_one_test():
    bare = [f"{phase}: {title}" for phase, title, body in sections() if not TEST_ID.search(body)]
    assert not bare, (
        f"invariants in {PAGE.relative_to(ROOT)} with no test (name one as "
        "`tests/engine/test_x.py::test_name` under the heading):\n  " + "\n  ".join(bare)
    )


def test_every_named_test_exists():
    missing = []
    for _, title, body in sections():
        for path, name in TEST_ID.findall(body):
            file = ROOT / path
            if not file.is_file():
                missing.append(f"{path}::{name} ({title}): no file {path}")
            elif name not in defined_names(file):
                missing.append(f"{path}::{name} ({title}): {path} defines no {name}")
    assert not missing, (
        f"{PAGE.relative_to(ROOT)} names tests that do not exist (renamed or removed? "
        "name the test that now checks the invariant):\n  " + "\n  ".join(missing)
    )


def test_phase_05_section_has_the_chapters_invariants():
    chapter = (ROOT / "book" / "src" / "phase-05" / "README.md").read_text(encoding="utf-8")
    match = re.search(r"^## The six invariants\s*\n(.*?)(?=^## )", chapter, flags=re.S | re.M)
    assert match, "phase-05/README.md has no '## The six invariants' section"
    items = re.findall(r"^\d+\. ", match.group(1), flags=re.M)
    listed = [title for phase, title, _ in sections() if phase.startswith("Phase 05")]
    numbered = [t for t in listed if re.match(r"\d+\. ", t)]
    assert len(numbered) == len(items), (
        f"the chapter lists {len(items)} invariants, {PAGE.relative_to(ROOT)}'s Phase 05 "
        f"section numbers {len(numbered)}: {numbered}"
    )
