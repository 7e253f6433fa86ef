"""Headline numbers: the few measurements the course quotes, one results file per model shape.

`benchmarks/results/headline-<shape>.md` holds, each under a key, the numbers the Phase 05
chapter, the cheat sheet, the notebooks, the figures and the simulator presets quote about
that shape: the eager and the graph decode step, kernels a step, what an eager kernel costs
the host, what a graph node costs the GPU, the fastest step so far. Each comes with its
median and spread over repeated runs where there are several, and with the file it was
copied from where it comes from another recorded run.

The course's tooling, not the engine's: scripts/gpu/headline_numbers.py measures a shape
and writes its file with the functions here (`summarise_runs`, `format_headline_file`);
the figures read one (`read_headlines`, `read_table`); tests/course/test_headline_numbers.py
checks that every place quoting it quotes what it holds.

    rows = read_headlines("benchmarks/results/headline-smollm2-135m.md")
    rows["plain_full_step_ms"].value       # '2.912', as written in the file
    read_table(path, "by_batch")           # one dict a row of the table under that anchor

vLLM counterpart: vllm/benchmarks/latency.py repeats one batch in one process and reports
percentiles; here the repeats are separate processes, because an eager step is mostly host
time, and host time moves by tens of percent from one process to the next.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BY_BATCH",
    "DEFAULT_MODES",
    "HEADLINE",
    "Headline",
    "format_headline_file",
    "kept_sections",
    "merge_headlines",
    "parse_pipe_table",
    "read_headlines",
    "read_table",
    "summarise_runs",
]

# The anchors of the two tables every headline file has (mdBook can include them).
HEADLINE, BY_BATCH = "headline", "by_batch"
COLUMNS = ("key", "what", "value", "spread", "runs", "source")
ONE_RUN = "one run"
MEASURED = "this file's runs"
# Sections the script writes; every other section of an older file is kept as it was,
# except the notes on the numbers it replaces.
GENERATED = ("The numbers", "By batch size", "Each run")
REPLACED_NOTES = "Notes on these numbers"

# The engine modes (mini_vllm.bench.harness.MODES) whose runs give the keys.
PLAIN_EAGER, PLAIN_FULL = "torch-only+eager", "torch-only+full"
ENGINE_EAGER, COMPILED = "eager", "compile+full"
DEFAULT_MODES = (PLAIN_EAGER, PLAIN_FULL, ENGINE_EAGER, COMPILED, "compile+full+async")


@dataclass(frozen=True)
class Headline:
    """One row of a headline file's table: a number as written, with where it comes from."""

    key: str
    what: str
    value: str  # as written: '2.912', '971', '5.70x'
    spread: str = ONE_RUN  # lowest-highest over the runs, or ONE_RUN
    runs: int = 1
    source: str = MEASURED

    @property
    def number(self) -> float:
        return float(self.value.replace(",", "").rstrip("x%"))

    def row(self) -> str:
        cells = (self.key, self.what, self.value, self.spread, str(self.runs), self.source)
        return "| " + " | ".join(cells) + " |"


# --- Reading -----------------------------------------------------------------------------


def parse_pipe_table(lines: Iterable[str]) -> list[dict[str, str]]:
    """The first pipe table in `lines`, one dict a row keyed by the header's cells."""
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    for line in lines:
        line = line.strip()
        if not line.startswith("|"):
            if header is not None:
                break
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if header is None:
            header = cells
        elif not all(re.fullmatch(r":?-+:?", cell) for cell in cells):
            rows.append(dict(zip(header, cells)))
    return rows


def read_table(path: str | Path, anchor: str) -> list[dict[str, str]]:
    """The rows of the table between `<!-- ANCHOR: anchor -->` and its ANCHOR_END."""
    text = Path(path).read_text(encoding="utf-8")
    match = re.search(
        rf"<!-- ANCHOR: {re.escape(anchor)} -->\n(.*?)<!-- ANCHOR_END: {re.escape(anchor)} -->",
        text,
        flags=re.S,
    )
    if not match:
        raise ValueError(f"{path} has no table under the anchor {anchor!r}")
    return parse_pipe_table(match.group(1).splitlines())


def read_headlines(path: str | Path) -> dict[str, Headline]:
    """The headline table of a file, by key."""
    rows = read_table(path, HEADLINE)
    return {
        row["key"]: Headline(
            row["key"], row["what"], row["value"], row["spread"], int(row["runs"]), row["source"]
        )
        for row in rows
    }


# --- Summarising the runs of scripts/gpu/headline_numbers.py ------------------------------


def _ms(x: float) -> str:
    return f"{x:.3f}"


def _us(x: float) -> str:
    return f"{x:.1f}"


def _node_us(x: float) -> str:
    return f"{x:.2f}"


def _count(x: float) -> str:
    return str(int(round(x)))


def _ratio(x: float) -> str:
    return f"{x:.2f}x"


def _spread(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    if len(values) < 2:
        return ONE_RUN
    return f"{fmt(min(values))}–{fmt(max(values))}"


def _headline(key: str, what: str, values: Sequence[float], fmt) -> Headline:
    return Headline(key, what, fmt(statistics.median(values)), _spread(values, fmt), len(values))


def _at(run: dict, batch: int, field: str):
    return run["batches"][str(batch)][field]


def _pairs(first: list[dict], second: list[dict]) -> list[tuple[dict, dict]]:
    """The runs of two configurations, paired by round (one process each a round): by
    their "round" where they have one, else in order."""
    if all("round" in r for r in first + second):
        by_round = {r["round"]: r for r in second}
        return [(r, by_round[r["round"]]) for r in first if r["round"] in by_round]
    return list(zip(first, second))


# The keys the script measures, in the order the file lists them.
KEYS = (
    "plain_kernels",
    "plain_eager_step_ms",
    "plain_eager_fwd_ms",
    "plain_full_step_ms",
    "plain_full_fwd_ms",
    "plain_speedup",
    "graph_us_per_node",
    "eager_kernels",
    "eager_step_ms",
    "host_us_per_eager_kernel",
    "compiled_kernels",
    "compile_full_step_ms",
    "best_step_ms",
    "best_kernels",
)
_PLAIN = 'the model on torch alone (custom_ops="none": no kernel of mini_vllm\'s own)'
# The keys read straight off one configuration's batch-1 results: key, what, mode, field.
_DIRECT = [
    ("plain_kernels", f"kernels a decode step, {_PLAIN}", PLAIN_EAGER, "kernels", _count),
    ("plain_eager_step_ms", f"eager step at batch 1, {_PLAIN}, ms", PLAIN_EAGER, "step_ms", _ms),
    (
        "plain_eager_fwd_ms",
        "that eager step's forward alone, synchronised, ms",
        PLAIN_EAGER,
        "forward_ms",
        _ms,
    ),
    (
        "plain_full_step_ms",
        "the same kernels as one FULL graph, step at batch 1, ms",
        PLAIN_FULL,
        "step_ms",
        _ms,
    ),
    (
        "plain_full_fwd_ms",
        "that FULL step's forward alone, synchronised, ms",
        PLAIN_FULL,
        "forward_ms",
        _ms,
    ),
    (
        "eager_kernels",
        "kernels a decode step, the engine's own kernels (the default)",
        ENGINE_EAGER,
        "kernels",
        _count,
    ),
    (
        "eager_step_ms",
        "eager step at batch 1, the engine's own kernels, ms",
        ENGINE_EAGER,
        "step_ms",
        _ms,
    ),
    (
        "compiled_kernels",
        "kernels a decode step, compiled (Inductor) and one FULL graph",
        COMPILED,
        "kernels",
        _count,
    ),
    (
        "compile_full_step_ms",
        "compiled and one FULL graph, step at batch 1, ms",
        COMPILED,
        "step_ms",
        _ms,
    ),
]


def summarise_runs(
    runs: dict[str, list[dict]],
) -> tuple[list[Headline], list[dict[str, str]]]:
    """The headline rows and the by-batch rows of a set of runs.

    `runs` maps an engine mode to its processes' results, one per round, in round order:
    `{"batches": {"1": {"step_ms", "forward_ms", "kernels", "kernel_ms"}, ...},
    "replay_gpu_ms": float | None}` (what headline_numbers.py's one-process prints).
    """
    rows: list[Headline] = []

    def add(key: str, what: str, values: Iterable[float | None], fmt) -> None:
        values = [v for v in values if v is not None]
        if values:
            rows.append(_headline(key, what, values, fmt))

    def batch_one(mode: str, field: str) -> list:
        return [_at(r, 1, field) for r in runs.get(mode, [])]

    for key, what, mode, field, fmt in _DIRECT:
        add(key, what, batch_one(mode, field), fmt)
    plain_e, plain_f = runs.get(PLAIN_EAGER, []), runs.get(PLAIN_FULL, [])
    add(
        "plain_speedup",
        "eager step / FULL step at batch 1, torch alone, the two processes of a round",
        (_at(e, 1, "step_ms") / _at(f, 1, "step_ms") for e, f in _pairs(plain_e, plain_f)),
        _ratio,
    )
    add(
        "graph_us_per_node",
        "GPU time a node of the torch-alone FULL graph costs at batch 1, its kernel "
        "included: one replay's GPU time (replays back to back, CUDA events) / nodes, us",
        (
            r["replay_gpu_ms"] * 1000 / _at(r, 1, "kernels")
            for r in plain_f
            if r.get("replay_gpu_ms") and _at(r, 1, "kernels")
        ),
        _node_us,
    )
    add(
        "host_us_per_eager_kernel",
        "host time an eager kernel costs at batch 1: (eager step - its kernels' GPU time, "
        "torch.profiler) / kernels, us",
        (
            (_at(r, 1, "step_ms") - _at(r, 1, "kernel_ms")) * 1000 / _at(r, 1, "kernels")
            for r in runs.get(ENGINE_EAGER, [])
            if _at(r, 1, "kernel_ms") is not None and _at(r, 1, "kernels")
        ),
        _us,
    )
    medians = {
        mode: statistics.median(_at(r, 1, "step_ms") for r in found)
        for mode, found in runs.items()
        if found and "1" in found[0]["batches"]
    }
    if medians:
        best = min(medians, key=medians.get)
        add(
            "best_step_ms",
            f"the fastest step at batch 1 measured here: {best}, ms",
            batch_one(best, "step_ms"),
            _ms,
        )
        add(
            "best_kernels",
            f"kernels a decode step of the fastest configuration, {best}",
            batch_one(best, "kernels"),
            _count,
        )
    rows.sort(key=lambda row: KEYS.index(row.key))
    return rows, _by_batch(plain_e, plain_f, runs.get(COMPILED, []))


def _by_batch(eager: list[dict], full: list[dict], compiled: list[dict]) -> list[dict[str, str]]:
    if not eager or not full:
        return []
    batches = set(eager[0]["batches"]) & set(full[0]["batches"])
    rows = []
    for b in sorted(map(int, batches)):
        pairs = _pairs(eager, full)
        e_step = [_at(r, b, "step_ms") for r in eager]
        f_step = [_at(r, b, "step_ms") for r in full]
        step_ratio = [_at(e, b, "step_ms") / _at(f, b, "step_ms") for e, f in pairs]
        fwd_ratio = [_at(e, b, "forward_ms") / _at(f, b, "forward_ms") for e, f in pairs]
        row = {
            "batch": str(b),
            "eager step ms": _ms(statistics.median(e_step)),
            "eager spread": _spread(e_step, _ms),
            "FULL step ms": _ms(statistics.median(f_step)),
            "FULL spread": _spread(f_step, _ms),
            "eager / FULL step": _ratio(statistics.median(step_ratio)),
            "eager fwd ms": _ms(statistics.median(_at(r, b, "forward_ms") for r in eager)),
            "FULL fwd ms": _ms(statistics.median(_at(r, b, "forward_ms") for r in full)),
            "eager / FULL fwd": _ratio(statistics.median(fwd_ratio)),
            "compiled + FULL step ms": "-",
            "runs": str(len(pairs)),
            "note": "",
        }
        if compiled and str(b) in compiled[0]["batches"]:
            steps = [_at(r, b, "step_ms") for r in compiled]
            row["compiled + FULL step ms"] = _ms(statistics.median(steps))
        rows.append(row)
    return rows


# --- Writing -----------------------------------------------------------------------------


def merge_headlines(new: Sequence[Headline], old: dict[str, Headline]) -> list[Headline]:
    """The new rows, then every row of the older file that was not measured again and
    names a source of its own (a row the older file measured itself is dropped: its runs
    go with that file)."""
    measured = {row.key for row in new}
    kept = [row for key, row in old.items() if key not in measured and row.source != MEASURED]
    return list(new) + kept


def kept_sections(text: str) -> str:
    """The sections of an older headline file that the script does not write (other runs,
    what the simulator presets are fitted to), as they were; its notes on the numbers
    it replaces are dropped with those numbers."""
    parts = re.split(r"(?m)^(?=## )", text)
    kept = []
    for part in parts[1:]:
        heading = part.splitlines()[0].removeprefix("## ").strip()
        if heading not in GENERATED and heading != REPLACED_NOTES:
            kept.append(part.rstrip() + "\n")
    return "\n".join(kept)


def _table(rows: Sequence[dict[str, str]], header: Sequence[str]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row.get(h, "") for h in header) + " |" for row in rows]
    return lines


def format_headline_file(
    shape: str,
    header: Sequence[str],
    headlines: Sequence[Headline],
    by_batch: Sequence[dict[str, str]],
    each_run: Sequence[dict[str, str]],
    kept: str = "",
) -> str:
    """A headline file: the title, the `header` lines (machine, date, command, how the
    runs were taken), the headline table, the by-batch table, every run, then the kept
    sections of the file it replaces."""
    lines = [
        f"# Headline numbers: the {shape} shape",
        "",
        "The numbers the course quotes about this model shape, each under a key. The Phase 05",
        "chapter, the cheat sheet, the notebooks, the figures and the simulator presets take",
        "them from here, and tests/course/test_headline_numbers.py fails when one of them",
        "quotes a number this file's tables do not hold: after measuring again, run that test",
        "to find every place that quotes an old value.",
        "",
        *header,
        "",
        "## The numbers",
        "",
        f"<!-- ANCHOR: {HEADLINE} -->",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
        *(row.row() for row in headlines),
        f"<!-- ANCHOR_END: {HEADLINE} -->",
    ]
    if by_batch:
        columns = list(by_batch[0])
        lines += [
            "",
            "## By batch size",
            "",
            "The model on torch alone, eager and as one FULL graph (and compiled with one FULL",
            "graph, where measured); each ratio is the median of the rounds' own ratios (the",
            "two processes of one round).",
            "",
            f"<!-- ANCHOR: {BY_BATCH} -->",
            *_table(by_batch, columns),
            f"<!-- ANCHOR_END: {BY_BATCH} -->",
        ]
    if each_run:
        lines += ["", "## Each run", "", *_table(each_run, list(each_run[0]))]
    text = "\n".join(lines) + "\n"
    if kept:
        text += "\n" + kept
    return text
