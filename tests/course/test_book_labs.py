"""Every lab is listed, with its tag, on its phase's
page, in labs/README.md and in the book's lab index.

A lab's own README says which phase it belongs to and its tag on its third line:
`**Tag: CPU-OK** · Phase 05 · ...`. That line is the source of truth here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LABS = sorted(p for p in (ROOT / "labs").glob("phase-*/lab-*") if p.is_dir())
IDS = [f"{p.parent.name}/{p.name}" for p in LABS]
TAG_LINE = re.compile(r"\*\*Tag: (CPU-OK|GPU-REQ)\*\*.*?Phase (\d\d)")


def tag_and_phase(lab: Path) -> tuple[str, str]:
    match = TAG_LINE.search((lab / "README.md").read_text(encoding="utf-8"))
    assert match, f"{lab.name}/README.md does not state '**Tag: CPU-OK|GPU-REQ** · Phase NN'"
    return match.group(1), match.group(2)


@pytest.mark.parametrize("lab", LABS, ids=IDS)
def test_phase_page_lists_the_lab_with_its_tag(lab: Path):
    tag, phase = tag_and_phase(lab)
    assert lab.parent.name == f"phase-{phase}", f"{lab} says it belongs to Phase {phase}"
    key = f"{lab.parent.name}/{lab.name}"
    page = ROOT / "book" / "src" / f"phase-{phase}" / "README.md"
    rows = [line for line in page.read_text(encoding="utf-8").splitlines() if f"`{key}`" in line]
    assert rows, f"{page.relative_to(ROOT)} does not list {key}"
    assert any(tag in row for row in rows), (
        f"{page.relative_to(ROOT)} lists {lab.name} without its tag {tag}"
    )


@pytest.mark.parametrize("lab", LABS, ids=IDS)
def test_lab_indexes_list_the_lab_with_its_tag(lab: Path):
    tag, _ = tag_and_phase(lab)
    for index in (ROOT / "labs" / "README.md", ROOT / "book" / "src" / "labs.md"):
        key = f"{lab.parent.name}/{lab.name}"
        rows = [line for line in index.read_text(encoding="utf-8").splitlines() if key in line]
        assert rows and any(tag in row for row in rows), (
            f"{index.relative_to(ROOT)}: no row for {lab.name} ({tag})"
        )


def test_every_phase_page_has_labs():
    pages = sorted((ROOT / "book" / "src").glob("phase-*/README.md"))
    phases_with_labs = {tag_and_phase(lab)[1] for lab in LABS}
    assert len(pages) == 8 and len(LABS) >= 13
    for page in pages:
        assert page.parent.name.removeprefix("phase-") in phases_with_labs, (
            f"{page.parent.name} has no lab"
        )
