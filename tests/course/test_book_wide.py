"""Book-wide checks: what every page of the book, every lab and every notebook must hold to.

Each test names the file and line (or page and sentence) to fix, and what the fix is.

- reader's language: no word about how the project was made (a reader has only the
  repository): no "stretch" goal, no "session", "lent GPU", "COURSE_SPEC", "spec §",
  "issue 12", and no "target" meaning a goal of this project ("target 65%", "our target",
  "every target that was not met"); "compile target", a hit-rate target, an FX node's
  target are fine;
- numbers cannot drift: a sentence that cites a results file quotes only numbers found in
  that file, as written (in a headline file, benchmarks/results/headline-*.md, in its
  tables: tests/course/test_headline_numbers.py says more);
- vLLM links are pinned to one commit;
- every phase has its seven parts, and each chapter ends with its readings.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "book" / "src"
RESULTS = ROOT / "benchmarks" / "results"
PHASES = [f"{n:02d}" for n in range(8)]
VLLM_PIN = "9aaf83ef502fc37bc647f6e474314d48ba36cd1c"


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def notebook_text(path: Path) -> str:
    """The cells' sources, one after another (outputs are made by these sources)."""
    cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    return "\n".join("".join(cell.get("source", [])) for cell in cells)


def read(path: Path) -> str:
    if path.suffix == ".ipynb":
        return notebook_text(path)
    return path.read_text(encoding="utf-8")


def book_pages() -> list[Path]:
    return sorted(SRC.rglob("*.md"))


def lab_files() -> list[Path]:
    """labs/README.md, and each lab's README and starter files (not its tests)."""
    found = [ROOT / "labs" / "README.md"]
    for lab in sorted((ROOT / "labs").glob("phase-*/lab-*")):
        found += sorted(
            p
            for p in lab.rglob("*")
            if p.suffix in (".md", ".py") and "tests" not in p.relative_to(lab).parts
        )
    return [p for p in found if p.is_file()]


def notebooks() -> list[Path]:
    return sorted((ROOT / "notebooks").glob("*.ipynb"))


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


# ---------------------------------------------------------------------------------------
# Reader's language

PROJECT_WORDS = [
    # "stretch goal", "the stretch target", "a stretch": not "a stretch of 128 tokens"
    (r"\bstretch\b(?!\s+of\b)", "'stretch' (a goal of this project)"),
    (r"\blent\s+(?:an?\s+|the\s+)?(?:H100|H200|machine|GPU|device)", "'lent <machine>'"),
    (r"\bthe\s+device\s+tool\b", "'the device tool'"),
    (r"\b(?:earlier|this|previous|next|last|a\s+later)\s+session\b", "'... session'"),
    (r"COURSE_SPEC", "'COURSE_SPEC'"),
    (r"\bspec\s*§", "'spec §'"),
    (r"\bissue\s+#?\d", "'issue N'"),
    (r"\bwe\s+were\s+asked\b", "'we were asked'"),
    # "target" as a goal of this project
    (r"\b(?:our|my|stretch|course'?s?|project'?s?)\s+targets?\b", "'our target'"),
    (r"\btargets?\s*(?:of\s+|was\s+|is\s+|:\s*)?[~≈]?\d", "'target <number>'"),
    (
        r"\btargets?\b(?:\s+(?:that|which|they|we|it))?\s+(?:(?:was|were|is|are)\s+)?"
        r"(?:not\s+)?(?:met|missed|miss|reached|hit|beaten)\b",
        "'target (not) met/missed'",
    ),
    (
        r"\b(?:miss(?:es|ed)?|meets?|met|beats?|beaten)\s+(?:the|our|its|every|each|all|a)"
        r"\s+targets?\b",
        "'met/missed the target'",
    ),
    (r"\bevery\s+target\b|\bleft\s+the\s+targets\b", "'every target'"),
]


def language_sources() -> list[Path]:
    figures = sorted((ROOT / "scripts" / "figures").glob("*.py"))
    return book_pages() + notebooks() + lab_files() + figures


def test_readers_language_has_no_word_about_how_the_project_was_made():
    hits = []
    for path in language_sources():
        text = read(path)
        for pattern, what in PROJECT_WORDS:
            for match in re.finditer(pattern, text, flags=re.I):
                where = f"{rel(path)}:{line_of(text, match.start())}"
                if path.suffix == ".ipynb":
                    where = f"{rel(path)} (cell source, line {line_of(text, match.start())})"
                hits.append(f"{where}: {what}: ...{' '.join(match.group(0).split())}...")
    assert not hits, (
        "Words about how the project was made, not about the subject. Rewrite each for a "
        "reader who has only the repository (a measured result is compared with the "
        "course's reference or with vLLM, never with a 'target'):\n  " + "\n  ".join(hits)
    )


# ---------------------------------------------------------------------------------------
# Numbers cannot drift

RESULT_NAMES = sorted(p.name for p in RESULTS.glob("*.md"))
CITES = re.compile(
    r"(?<![\w.-])(?:[\w./-]*benchmarks/results/)?("
    + "|".join(re.escape(n) for n in RESULT_NAMES)
    + r")(?![\w-])"
)
# a number with a thousands separator, or digits with an optional decimal part; not part of
# a word (H100, bf16) nor right after a word and a hyphen (Llama-3.2-1B); both ends of a
# range (0.506-0.507) are numbers
NUMBER = re.compile(
    r"(?<![\w.,])(?<![A-Za-z]-)(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)(?!\d)(?![.,]\d)"
)
INCLUDE_LINE = re.compile(r"^\s*\{\{#\w+[^}]*\}\}\s*$")


def sentences(markdown: str):
    """(line, sentence) for each sentence of a page's prose: paragraphs, list items and
    table rows; code blocks, include lines and HTML comments left out."""
    markdown = re.sub(r"<!--.*?-->", lambda m: "\n" * m.group(0).count("\n"), markdown, flags=re.S)
    units, current, start, fenced = [], [], 0, False
    for number, line in enumerate(markdown.split("\n"), start=1):
        stripped = line.strip()
        if stripped.startswith(("```", "~~~")):
            fenced = not fenced
            units.append((start, current))
            current = []
            continue
        if fenced or INCLUDE_LINE.match(line):
            continue
        new_unit = (
            not stripped
            or stripped.startswith(("|", "#"))
            or re.match(r"^\s*(?:[-*+]|\d+\.)\s", line)
            or (current and current[-1].lstrip().startswith("|"))
        )
        if new_unit:
            units.append((start, current))
            current, start = [], number
        if stripped:
            current.append(stripped.lstrip("> "))
            start = start or number
    units.append((start, current))
    for start, lines in units:
        text = " ".join(lines)
        for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z(\[`*])", text):
            if sentence.strip():
                yield start, sentence


def source_text(name: str) -> str:
    """What a sentence citing the results file `name` may quote from: the whole file, or
    for a headline file (benchmarks/results/headline-*.md) its tables alone, the numbers
    it stands for; its notes about them are not a source."""
    text = (RESULTS / name).read_text(encoding="utf-8")
    if name.startswith("headline-"):
        return "\n".join(line for line in text.splitlines() if line.lstrip().startswith("|"))
    return text


def quoted_numbers(sentence: str) -> list[str]:
    text = re.sub(r"\]\([^)]*\)", "]", sentence)  # link targets
    text = re.sub(r"\b(?:SmolLM2|Llama)[\w.-]*", " ", text, flags=re.I)  # model names
    text = re.sub(r"(`+).*?\1", " ", text)  # inline code: paths, flags, commands
    text = re.sub(r"https?://\S+", " ", text)
    text = re.sub(r"[\w./-]*\.(?:md|py|json|ipynb|png|csv|txt)\b", " ", text)  # file names
    found = []
    for match in NUMBER.finditer(text):
        number = match.group(1)
        digits = number.replace(",", "")
        if "." not in number and len(digits) < 3:
            continue
        if "." not in number and re.fullmatch(r"(?:19|20)\d\d", digits):
            continue  # a year
        found.append(number)
    return found


def appears_in(number: str, text: str) -> bool:
    forms = {number, number.replace(",", "")}
    return any(re.search(rf"(?<![\d.]){re.escape(f)}(?!\d)(?!\.\d)", text) for f in forms)


def test_numbers_quoted_with_a_results_file_appear_in_that_file():
    texts = {name: source_text(name) for name in RESULT_NAMES}
    drift = []
    for page in book_pages():
        for line, sentence in sentences(page.read_text(encoding="utf-8")):
            cited = sorted(set(CITES.findall(sentence)))
            if not cited:
                continue
            missing = [
                n
                for n in quoted_numbers(sentence)
                if not any(appears_in(n, texts[name]) for name in cited)
            ]
            if missing:
                drift.append(
                    f"{rel(page)}:{line}: {', '.join(missing)} not in "
                    f"{' or '.join(cited)}\n      sentence: {sentence[:300]}"
                )
    assert not drift, (
        "A sentence that cites a results file may quote only numbers written in that file "
        "(as written: no rounding). Quote the file's figure, or move the number to a "
        "sentence that says where it comes from:\n  " + "\n  ".join(drift)
    )


# ---------------------------------------------------------------------------------------
# vLLM links pinned

VLLM_LINK = re.compile(
    r"https?://(?:github\.com|raw\.githubusercontent\.com)/vllm-project/vllm(?![\w.-])[^\s)\]>\"'`]*"
)
PINNED = re.compile(rf"^https://github\.com/vllm-project/vllm/(?:blob|tree)/{VLLM_PIN}(?:[/#]|$)")


def test_vllm_links_are_pinned_to_one_commit():
    bad = []
    everything_in_labs = sorted(
        p for p in (ROOT / "labs").rglob("*") if p.suffix in (".md", ".py", ".txt", ".json")
    )
    for path in book_pages() + everything_in_labs + notebooks():
        text = read(path)
        for match in VLLM_LINK.finditer(text):
            if not PINNED.match(match.group(0)):
                bad.append(f"{rel(path)}:{line_of(text, match.start())}: {match.group(0)}")
    assert not bad, (
        f"Every link into vLLM is a permalink at commit {VLLM_PIN}: "
        f"https://github.com/vllm-project/vllm/blob/{VLLM_PIN}/<path>#L<a>-L<b> "
        f"(or tree/{VLLM_PIN}/<folder>), line numbers checked against that commit; no "
        "branch (main), tag or other commit, and no bare link to the repository:\n  "
        + "\n  ".join(bad)
    )


# ---------------------------------------------------------------------------------------
# Seven parts a phase

PARTS = ["README.md", "01-deep-dive.md", "02-mini-build.md", "EXERCISES.md", "INTERVIEW.md"]
MIN_WORDS = {"README.md": 1500}
MIN_WORDS_DEFAULT = 400


def prose_words(markdown: str) -> int:
    """Words a reader reads on the page itself: code blocks, include lines (whose text lives
    in another file), HTML comments, link targets and table rules are not counted."""
    text = re.sub(r"<!--.*?-->", " ", markdown, flags=re.S)
    text = re.sub(r"^\s*(```|~~~).*?^\s*\1\s*$", " ", text, flags=re.S | re.M)
    text = "\n".join(line for line in text.split("\n") if not INCLUDE_LINE.match(line))
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"^\s*\|?[\s:|-]+\|[\s:|-]*$", " ", text, flags=re.M)
    return len(re.findall(r"[A-Za-z0-9][\w'’.,%×/+-]*", text))


def word_table() -> str:
    rows = ["phase  " + "  ".join(f"{p:>16}" for p in PARTS)]
    for phase in PHASES:
        cells = []
        for part in PARTS:
            page = SRC / f"phase-{phase}" / part
            cells.append(
                str(prose_words(page.read_text(encoding="utf-8"))) if page.exists() else "-"
            )
        rows.append(f"{phase:>5}  " + "  ".join(f"{c:>16}" for c in cells))
    minimum = ", ".join(f"{p} {MIN_WORDS.get(p, MIN_WORDS_DEFAULT)}" for p in PARTS)
    return "words of prose a page (minimum: " + minimum + "):\n" + "\n".join(rows)


def notebook_phases() -> set[str]:
    covered = set()
    for path in notebooks():
        match = re.match(r"phase-(\d\d)(?:-(\d\d))?-", path.name)
        if match:
            covered.update(g for g in match.groups() if g)
    return covered


@pytest.mark.parametrize("phase", PHASES)
def test_every_phase_has_its_seven_parts(phase):
    folder = SRC / f"phase-{phase}"
    missing = []
    for part in PARTS:
        page = folder / part
        if not page.exists():
            missing.append(f"page {rel(page)} is missing")
            continue
        words = prose_words(page.read_text(encoding="utf-8"))
        need = MIN_WORDS.get(part, MIN_WORDS_DEFAULT)
        if words < need:
            missing.append(f"{rel(page)} has {words} words of prose; it needs {need}")
    labs = [
        p for p in (ROOT / "labs" / f"phase-{phase}").glob("lab-*") if (p / "README.md").exists()
    ]
    if not labs:
        missing.append(f"no lab (labs/phase-{phase}/lab-MM-name/README.md)")
    if phase not in notebook_phases():
        missing.append(f"no notebook notebooks/phase-{phase}-*.ipynb")
    figures = set()
    for page in folder.glob("*.md"):
        for name in re.findall(r"figures/([\w.-]+\.png)", page.read_text(encoding="utf-8")):
            if (SRC / "figures" / name).exists():
                figures.add(name)
    if not figures:
        missing.append(
            f"no figure: none of phase-{phase}'s pages shows a book/src/figures/*.png "
            f"(drawn by scripts/figures/phase{phase}.py)"
        )
    chapter = folder / "README.md"
    if chapter.exists():
        text = chapter.read_text(encoding="utf-8")
        headings = re.findall(r"^## +(.+?)\s*$", text, flags=re.M)
        if not headings or headings[-1] != "Readings":
            missing.append(
                f"{rel(chapter)} does not end with a '## Readings' section "
                f"(its last section is {headings[-1] if headings else 'none'!r})"
            )
        else:
            readings = text[text.rindex("## Readings") :]
            if not re.search(r"\]\((?:https?://|\.\.?/)[^)]+\)|<https?://", readings):
                missing.append(f"{rel(chapter)}: '## Readings' has no link")
    assert not missing, f"Phase {phase}:\n  " + "\n  ".join(missing) + "\n\n" + word_table()
