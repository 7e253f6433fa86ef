"""One source of truth for the numbers the course quotes as headlines.

`benchmarks/results/headline-<shape>.md` holds them, one file a model shape: each number
under a key, with its median and spread over repeated runs, how many runs, and where it
comes from (scripts/figures/headline.py reads and writes the files;
scripts/gpu/headline_numbers.py measures them on a GPU). A place that quotes one links it
to its source the way the rest of the book does (tests/course/test_book_wide.py): the
sentence names the file. Checked here:

- each headline file says where every number comes from: machine, date, command and runs
  lines; a spread wherever there is more than one run, and "one run" where there is one;
  a number copied from another results file written there as it is (or, computed from
  it, the sum in the source cell giving the value);
- the places that quote headline numbers -- the Phase 05 chapter, the cheat sheet
  (CHEATSHEET.md, which the book's cheat sheet page includes), the notebooks (markdown,
  and the text their cells printed), the figures' titles and their captions in the book,
  and the repository's README -- quote from a results file only numbers it holds, and
  from a headline file only numbers in its tables;
- in those places, a sentence that quotes a number and names a results file names a
  headline file: the one file to refresh after measuring again. The detailed results
  files are for the case-study pages (performance, fact-check) and for further reading;
- a figure's title and caption quote only numbers of the files it is drawn from (`SOURCES`
  in its script) or names; the chapter's figures are drawn from headline files;
- each simulator preset names its headline file, whose table of what the presets are
  fitted to holds the preset's every reference pair (and its kernel count, where it is
  fitted to one).

A failure names the place, the number, and the file that should hold it. After measuring
again, the failures are the list of places to update.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import operator
import re
import statistics
import sys
from pathlib import Path

import pytest

# The headline files' reader and writer live with the figures (scripts/figures/headline.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "figures"))
from headline import (
    BY_BATCH,
    COLUMNS,
    MEASURED,
    ONE_RUN,
    Headline,
    format_headline_file,
    kept_sections,
    merge_headlines,
    parse_pipe_table,
    read_headlines,
    read_table,
    summarise_runs,
)

from tests.course.test_book_wide import (
    CITES,
    RESULTS,
    appears_in,
    quoted_numbers,
    sentences,
    source_text,
)

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "book" / "src"
CHAPTER = SRC / "phase-05" / "README.md"
CHEATSHEET = ROOT / "CHEATSHEET.md"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
FIGURE_SCRIPTS = ROOT / "scripts" / "figures"
SHAPES = ["smollm2-135m", "llama-3.2-1b-like", "llama-3.1-8b-like"]
HEADLINE_FILES = sorted(RESULTS.glob("headline-*.md"))


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def is_headline(name: str) -> bool:
    return Path(name).name.startswith("headline-")


def missing_numbers(text: str, cited: set[str]) -> list[str]:
    return [
        n for n in quoted_numbers(text) if not any(appears_in(n, source_text(c)) for c in cited)
    ]


# ---------------------------------------------------------------------------------------
# The headline files


def test_there_is_a_headline_file_for_each_shape_the_course_quotes():
    missing = [s for s in SHAPES if not (RESULTS / f"headline-{s}.md").is_file()]
    assert not missing, f"no benchmarks/results/headline-<shape>.md for {missing}"


@pytest.mark.parametrize("path", HEADLINE_FILES, ids=lambda p: p.name)
def test_a_headline_file_says_where_each_number_comes_from(path: Path):
    text = path.read_text(encoding="utf-8")
    problems = [
        f"no '- {line}:' line in its header"
        for line in ("machine", "date", "command", "runs")
        if not re.search(rf"^- {line}:", text, flags=re.M)
    ]
    rows = read_table(path, "headline")
    header = list(rows[0]) if rows else []
    if header != list(COLUMNS):
        problems.append(f"its headline table's columns are {header}, not {list(COLUMNS)}")
    keys = [row.get("key", "") for row in rows]
    problems += [f"key {k!r} twice" for k in sorted({k for k in keys if keys.count(k) > 1})]
    for row in read_headlines(path).values():
        where = f"key {row.key}"
        if not re.fullmatch(r"[a-z][a-z0-9_]*", row.key):
            problems.append(f"{where}: a key is lower_snake_case")
        try:
            value = row.number
        except ValueError:
            problems.append(f"{where}: value {row.value!r} is not a number")
            continue
        if row.runs < 1:
            problems.append(f"{where}: runs must be 1 or more")
        elif row.runs == 1 and row.spread != ONE_RUN:
            problems.append(f"{where}: one run, so its spread says {ONE_RUN!r}")
        elif row.runs > 1 and row.spread != "not recorded":
            ends = re.fullmatch(r"([\d.,]+)x?–([\d.,]+)x?", row.spread)
            if not ends:
                problems.append(f"{where}: spread {row.spread!r} is not 'lowest–highest'")
            elif not float(ends[1].replace(",", "")) <= value <= float(ends[2].replace(",", "")):
                problems.append(f"{where}: the median {row.value} is outside {row.spread}")
    batch_rows = read_table(path, BY_BATCH)
    need = {"batch", "eager step ms", "FULL step ms", "eager fwd ms", "FULL fwd ms", "note"}
    if not batch_rows or not need <= set(batch_rows[0]):
        problems.append(f"its by-batch table lacks columns {sorted(need - set(batch_rows[0]))}")
    assert not problems, f"{rel(path)}:\n  " + "\n  ".join(problems)


FILE_IN_CELL = re.compile(r"`([\w./-]+\.md)`")
EXPRESSION_IN_CELL = re.compile(r"`([\d.\s()+*/-]+)`")
_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def evaluate(expression: str) -> float:
    """An arithmetic expression of numbers, + - * / and brackets."""

    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError(f"not plain arithmetic: {expression!r}")

    return walk(ast.parse(expression, mode="eval"))


def cited_path(name: str) -> Path:
    """A file named in a source cell: a results file by name, or a path from the root."""
    return ROOT / name if "/" in name else RESULTS / name


def check_copied(value: str, source: str, where: str) -> list[str]:
    """A value and the source cell it was copied (or computed) from."""
    files = FILE_IN_CELL.findall(source)
    if not files:
        return []
    missing = [f for f in files if not cited_path(f).is_file()]
    if missing:
        return [f"{where}: its source {missing} does not exist"]
    texts = {f: cited_path(f).read_text(encoding="utf-8") for f in files}
    expression = EXPRESSION_IN_CELL.search(source)
    if expression:
        # the numbers of the sum come from the source; 1000 converts ms to us
        numbers = [n for n in re.findall(r"\d+(?:\.\d+)?", expression[1]) if n != "1000"]
        problems = [
            f"{where}: {n} of `{expression[1]}` is not in {' or '.join(files)}"
            for n in numbers
            if not any(appears_in(n, t) for t in texts.values())
        ]
        decimals = len(value.rstrip("x%").partition(".")[2])
        computed = f"{evaluate(expression[1]):.{decimals}f}"
        if computed != value.rstrip("x%").replace(",", ""):
            problems.append(f"{where}: `{expression[1]}` gives {computed}, not {value}")
        return problems
    if not any(appears_in(value.rstrip("x%"), t) for t in texts.values()):
        return [f"{where}: {value} is not written in {' or '.join(files)}"]
    return []


def tables(text: str) -> list[tuple[str, list[dict[str, str]]]]:
    """(the section heading, the rows) of every pipe table of a markdown file."""
    found, heading, lines = [], "", text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("## "):
            heading = lines[i][3:].strip()
        if lines[i].startswith("|"):
            block = []
            while i < len(lines) and lines[i].startswith("|"):
                block.append(lines[i])
                i += 1
            found.append((heading, parse_pipe_table(block)))
            continue
        i += 1
    return found


@pytest.mark.parametrize("path", HEADLINE_FILES, ids=lambda p: p.name)
def test_a_copied_number_is_written_in_its_source_as_it_is(path: Path):
    problems = []
    for row in read_headlines(path).values():
        where = f"key {row.key}"
        if FILE_IN_CELL.search(row.source):
            problems += check_copied(row.value, row.source, where)
        elif row.source != MEASURED and "not measured" not in row.source:
            problems.append(
                f"{where}: its source names no results file (in backticks), and it is "
                f"neither {MEASURED!r} nor said to be 'not measured' here"
            )
        elif row.source == MEASURED and "\n## Each run" not in path.read_text():
            problems.append(f"{where}: measured here, but the file has no 'Each run' section")
    # The by-batch table: copied from the file its caption names (ratios are computed).
    text = path.read_text(encoding="utf-8")
    caption = text[text.index("## By batch size") : text.index(f"<!-- ANCHOR: {BY_BATCH} -->")]
    origin = FILE_IN_CELL.search(caption)
    if origin:
        for row in read_table(path, BY_BATCH):
            for column, cell in row.items():
                if re.fullmatch(r"[\d.,]+", cell) and column not in ("batch", "runs"):
                    where = f"by batch {row['batch']}, {column}"
                    problems += check_copied(cell, f"`{origin[1]}`", where)
    # The other tables (other runs; what the presets are fitted to): each row naming a
    # source holds, in its number columns, numbers written there.
    for heading, rows in tables(text):
        if heading in ("The numbers", "By batch size", "Each run"):
            continue
        for row in rows:
            for column in ("value", "eager ms", "graph ms"):
                cell = row.get(column, "")
                if re.fullmatch(r"[\d.,]+", cell):
                    where = f"'{heading}', {column} {cell}"
                    problems += check_copied(cell, row.get("source", ""), where)
    assert not problems, f"{rel(path)}:\n  " + "\n  ".join(problems)


# ---------------------------------------------------------------------------------------
# The places that quote them


def markdown_units(path: Path):
    text = path.read_text(encoding="utf-8")
    for line, sentence in sentences(text):
        yield f"{rel(path)}:{line}", sentence


def notebook_units(path: Path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    for i, cell in enumerate(cells):
        source = "".join(cell.get("source", []))
        if cell["cell_type"] == "markdown":
            for line, sentence in sentences(source):
                yield f"{rel(path)} cell {i}, line {line}", sentence
        for output in cell.get("outputs", []):
            printed = "".join(output.get("text", []))
            printed += "".join(output.get("data", {}).get("text/plain", []))
            for n, line in enumerate(printed.splitlines(), start=1):
                yield f"{rel(path)} cell {i}, output line {n}", line


def text_units():
    """Every quoting unit of the places that take their numbers from headline files."""
    yield from markdown_units(CHAPTER)
    yield from markdown_units(CHEATSHEET)
    for notebook in NOTEBOOKS:
        yield from notebook_units(notebook)


def test_the_book_shows_the_cheat_sheet_these_tests_read():
    page = (SRC / "cheatsheet.md").read_text(encoding="utf-8")
    assert "{{#include ../../CHEATSHEET.md}}" in page


def test_a_quoted_number_is_in_the_results_file_the_sentence_names():
    drift = []
    # the repository's README too: its "Measured" section quotes the headline numbers
    for where, text in [*text_units(), *markdown_units(ROOT / "README.md")]:
        cited = set(CITES.findall(text))
        missing = missing_numbers(text, cited) if cited else []
        if missing:
            drift.append(
                f"{where}: {', '.join(missing)} not in {' or '.join(sorted(cited))}\n"
                f"      {text[:300]}"
            )
    assert not drift, (
        "A sentence that names a results file quotes only numbers written there (in a "
        "headline file: in its tables), as written. Quote the file's number, or update the "
        "file:\n  " + "\n  ".join(drift)
    )


def test_the_chapter_cheat_sheet_and_notebooks_quote_from_headline_files():
    elsewhere = []
    for where, text in text_units():
        cited = set(CITES.findall(text))
        others = sorted(c for c in cited if not is_headline(c))
        if others and quoted_numbers(text):
            elsewhere.append(f"{where}: quotes {', '.join(quoted_numbers(text))} from {others}")
    assert not elsewhere, (
        "The chapter, the cheat sheet and the notebooks quote measured numbers from the "
        "headline files (benchmarks/results/headline-<shape>.md), so that one file holds "
        "each number the course repeats. Move the number into the shape's headline file "
        "(with its source) and cite that, or drop it; naming a detailed results file for "
        "further reading is fine in a sentence that quotes no number:\n  " + "\n  ".join(elsewhere)
    )


# --- Figures -------------------------------------------------------------------------


def _figure_modules():
    pytest.importorskip("matplotlib")
    sys.path.insert(0, str(FIGURE_SCRIPTS))
    modules = {}
    for script in sorted(FIGURE_SCRIPTS.glob("phase*.py")):
        spec = importlib.util.spec_from_file_location(f"headline_{script.stem}", script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        modules[script.stem] = module
    return modules


@pytest.fixture(scope="module")
def figure_texts() -> dict[str, tuple[list[str], set[str]]]:
    """For each figure: its title texts (suptitle, every axes title) and the captions the
    book gives it, and the results files it is drawn from."""
    found = {}
    for module in _figure_modules().values():
        sources = getattr(module, "SOURCES", {})
        for name, draw in module.FIGURES.items():
            fig = draw()
            texts = [fig._suptitle.get_text()] if fig._suptitle else []
            texts += [
                ax.get_title(loc)
                for ax in fig.axes
                for loc in ("left", "center", "right")
                if ax.get_title(loc)
            ]
            found[name] = (texts, {Path(p).name for p in sources.get(name, [])})
    for page in SRC.rglob("*.md"):
        for alt, name in re.findall(
            r"!\[([^\]]*)\]\([^)]*figures/([\w.-]+\.png)\)", page.read_text()
        ):
            if name in found:
                found[name][0].append(alt)
    return found


def test_a_figure_title_or_caption_quotes_only_numbers_of_its_sources(figure_texts):
    """A figure drawn from the simulators alone (no SOURCES, no file named in its title)
    is not checked: its numbers are the model's."""
    drift = []
    for name, (texts, sources) in sorted(figure_texts.items()):
        missing_sources = [s for s in sources if not (RESULTS / s).is_file()]
        if missing_sources:
            drift.append(f"{name}: SOURCES names {missing_sources}, which do not exist")
            continue
        for text in texts:
            cited = sources | set(CITES.findall(text))
            missing = missing_numbers(text, cited) if cited else []
            if missing:
                drift.append(f"{name}: {', '.join(missing)} not in {sorted(cited)}: {text!r}")
    assert not drift, (
        "A figure's title and captions state what was measured and quote it from the "
        "results files the figure is drawn from; what a model computes from them goes in "
        "the legend and the labels:\n  " + "\n  ".join(drift)
    )


def test_the_chapters_figures_are_drawn_from_headline_files(figure_texts):
    shown = set(re.findall(r"figures/([\w.-]+\.png)", CHAPTER.read_text(encoding="utf-8")))
    wrong = {
        name: sorted(figure_texts[name][1])
        for name in shown
        if any(not is_headline(s) for s in figure_texts[name][1])
    }
    assert not wrong, f"the chapter's figures drawn from detailed results files: {wrong}"


# --- Simulator presets ---------------------------------------------------------------


def fitted_rows(source: Path, preset: str) -> dict[int, dict[str, str]]:
    text = source.read_text(encoding="utf-8")
    return {
        int(row["batch"]): row
        for heading, rows in tables(text)
        if heading == "What the simulator presets are fitted to"
        for row in rows
        if row.get("preset") == preset
    }


def test_each_preset_names_the_headline_file_that_holds_what_it_is_fitted_to():
    from mini_vllm.teaching.launch_overhead import PRESETS

    problems = []
    for name, preset in PRESETS.items():
        source = ROOT / preset.source if preset.source else None
        if source is None or not is_headline(preset.source) or not source.is_file():
            problems.append(f"{name}: source {preset.source!r} is not a headline file")
            continue
        rows = fitted_rows(source, name)
        for batch, (eager, graph) in sorted(preset.reference_ms.items()):
            row = rows.get(batch)
            if row is None:
                problems.append(f"{name}: {rel(source)} has no row for batch {batch}")
                continue
            if (float(row["eager ms"]), float(row["graph ms"])) != (eager, graph):
                problems.append(
                    f"{name}, batch {batch}: fitted to {eager} -> {graph} ms, the file says "
                    f"{row['eager ms']} -> {row['graph ms']}"
                )
            if row["kernels"].isdigit() and int(row["kernels"]) != len(preset.kernels):
                problems.append(
                    f"{name}: {len(preset.kernels)} kernels, the file says {row['kernels']}"
                )
        extra = sorted(set(rows) - set(preset.reference_ms))
        if extra:
            problems.append(f"{name}: {rel(source)} lists batches {extra} it is not fitted to")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------
# Writing a headline file (what scripts/gpu/headline_numbers.py does, on made-up runs)


def _run(step: float, fwd: float, kernels: int = 100, replay: float | None = None) -> dict:
    one = {"step_ms": step, "forward_ms": fwd, "kernels": kernels, "kernel_ms": 1.0}
    two = {**one, "step_ms": step * 1.5, "forward_ms": fwd * 1.5}
    return {"batches": {"1": one, "2": two}, "replay_gpu_ms": replay}


def test_runs_become_medians_with_their_spread_and_a_file_that_reads_back(tmp_path):
    runs = {
        "torch-only+eager": [_run(10.0, 9.0), _run(14.0, 13.0), _run(12.0, 11.0)],
        "torch-only+full": [
            _run(2.0, 1.5, replay=0.2),
            _run(2.4, 1.9, replay=0.3),
            _run(2.2, 1.7, replay=0.25),
        ],
        "eager": [_run(8.0, 7.0, kernels=50)] * 3,
    }
    rows, by_batch = summarise_runs(runs)
    found = {row.key: row for row in rows}
    assert found["plain_eager_step_ms"].value == "12.000"
    assert found["plain_eager_step_ms"].spread == "10.000–14.000"
    assert found["plain_eager_step_ms"].runs == 3
    # ratios pair the processes of one round: 10/2, 14/2.4, 12/2.2
    assert found["plain_speedup"].value == f"{statistics.median([5, 14 / 2.4, 12 / 2.2]):.2f}x"
    assert found["graph_us_per_node"].value == "2.50"  # 0.25 ms over 100 nodes
    assert found["host_us_per_eager_kernel"].value == "140.0"  # (8 - 1) ms over 50 kernels
    assert (
        found["best_step_ms"].value == "2.200" and "torch-only+full" in found["best_step_ms"].what
    )
    assert [row["batch"] for row in by_batch] == ["1", "2"]

    old = tmp_path / "old.md"
    old.write_text(
        format_headline_file(
            "tiny",
            ["- machine: x", "- date: y", "- command: `z`", "- runs: 1"],
            [
                Headline("kept_key", "a number not measured again", "1.5", source="`a.md`"),
                Headline("old_run_key", "measured by the older file's own runs", "2.0"),
            ],
            [],
            [],
        )
        + "\n## Notes on these numbers\n\n- about the old numbers\n"
        + "\n## Other runs of the same quantities\n\n| quantity | value |\n|---|---|\n| q | 3 |\n"
    )
    merged = merge_headlines(rows, read_headlines(old))
    text = format_headline_file(
        "tiny",
        ["- machine: x", "- date: y", "- command: `z`", "- runs: 3"],
        merged,
        by_batch,
        [{"round": "1", "configuration": "eager"}],
        kept_sections(old.read_text()),
    )
    new = tmp_path / "new.md"
    new.write_text(text)
    back = read_headlines(new)
    assert back["plain_eager_step_ms"] == found["plain_eager_step_ms"]
    assert back["kept_key"].source == "`a.md`", "a key not measured again keeps its source"
    assert "old_run_key" not in back, "a key the older file measured itself goes with its runs"
    assert read_table(new, BY_BATCH)[0]["eager step ms"] == "12.000"
    assert "## Other runs of the same quantities" in text and "## Each run" in text
    assert "about the old numbers" not in text, "notes on replaced numbers are dropped"
