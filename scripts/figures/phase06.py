#!/usr/bin/env python3
"""Draw the figures of the Phase 06 chapter from recorded runs and mini_vllm.bench.ladder.

    .venv/bin/python scripts/figures/phase06.py              # all figures into book/src/figures/
    .venv/bin/python scripts/figures/phase06.py --only serve-itl-h100.png --out-dir /tmp

Two sources, both committed, so the PNGs are deterministic:
- the run recorded in labs/phase-06/lab-01-capture-ladder/data/trace.json (the tiny model
  served on CPU by the engine; regenerate it with the command stored in the file), read with
  `mini_vllm.bench.ladder`, for the TTFT/ITL and ladder figures;
- the serving benchmark of benchmarks/results/serve-cuda-h100.md (`bash
  scripts/gpu/serve_bench.sh` on an H100), whose table this script parses, for the ITL of
  eager, CUDA graphs and compiled + async under load.
Same pattern as scripts/figures/phase05.py: one function per figure returning a
`matplotlib.figure.Figure`, a fixed style, and a `FIGURES` dict.
"""

from __future__ import annotations

import functools
import re
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from figurekit import ROOT, styled  # also puts the checkout on sys.path
from figurekit import draw as _draw
from matplotlib.figure import Figure

from mini_vllm.bench.ladder import (
    choose_ladder,
    evaluate_ladder,
    load_trace,
    powers_of_two_ladder,
)

__all__ = [
    "FIGURES",
    "TRACE_FILE",
    "SERVE_RESULTS",
    "ladder_tradeoff_figure",
    "recorded_run",
    "serve_itl_figure",
    "serve_table",
    "trace_ladder_figure",
    "ttft_vs_itl_figure",
]

TRACE_FILE = ROOT / "labs" / "phase-06/lab-01-capture-ladder" / "data" / "trace.json"
SERVE_RESULTS = ROOT / "benchmarks" / "results" / "serve-cuda-h100.md"
GRAPH_BUDGET = 6  # the budget the chapter uses: as many rungs as powers of two up to 32
_CHOSEN_COLOR = "#2471a3"
_NAIVE_COLOR = "#c0392b"
_TAIL_COLOR = "#7f8c8d"
_PREFILL_COLOR = "#d68910"


@functools.lru_cache(maxsize=1)
def recorded_run() -> dict:
    return load_trace(TRACE_FILE)


def _trace() -> list[int]:
    return list(recorded_run()["decode_batch_sizes"])


@styled
def trace_ladder_figure(max_graphs: int = GRAPH_BUDGET) -> Figure:
    """Decode batch sizes of the recorded run, with
    the chosen ladder's rungs and the naive one's."""
    trace = _trace()
    counts = Counter(trace)
    chosen = choose_ladder(trace, max_graphs)
    naive = powers_of_two_ladder(max_graphs)
    fig = Figure(figsize=(7.6, 4.2))
    ax = fig.add_subplot()
    sizes = np.arange(1, max(trace) + 1)
    heights = [counts.get(int(s), 0) for s in sizes]
    colors = [_TAIL_COLOR if s > chosen[-1] else _CHOSEN_COLOR for s in sizes]
    ax.bar(sizes, heights, width=0.8, color=colors, alpha=0.55)
    top = max(heights) * 1.12
    for i, rung in enumerate(chosen):
        ax.axvline(
            rung + 0.45, color=_CHOSEN_COLOR, lw=1.6, label="chosen rungs" if i == 0 else None
        )
    for i, rung in enumerate(naive):
        ax.axvline(
            rung + 0.45,
            color=_NAIVE_COLOR,
            lw=1.2,
            ls="--",
            label="powers of two" if i == 0 else None,
        )
    c, n = evaluate_ladder(trace, chosen), evaluate_ladder(trace, naive)
    ax.text(
        chosen[-1] + 1,
        top * 0.93,
        "above the top rung:\nruns eagerly (a miss)",
        color=_TAIL_COLOR,
        fontsize=8,
        va="top",
    )
    ax.set_ylim(0, top)
    ax.set_xlim(0.3, max(naive[-1], max(trace)) + 1)
    ax.set_xlabel("decode batch size (requests in the step)")
    ax.set_ylabel("decode steps")
    ax.set_title(
        f"Recorded decode batch sizes ({len(trace)} steps) and two {max_graphs}-graph ladders"
    )
    ax.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, -0.16),
        ncol=2,
        title=(
            f"chosen {chosen}: hit {c.hit_rate:.1%}, padding {c.padding_waste:.1%}\npowers "
            f"of two: hit {n.hit_rate:.1%}, padding {n.padding_waste:.1%}"
        ),
        title_fontsize=8,
        frameon=False,
    )
    fig.tight_layout()
    return fig


@styled
def ladder_tradeoff_figure(max_graphs: int = 12, min_hit_rate: float = 0.92) -> Figure:
    """Hit rate and padding waste against the number of graphs: chosen ladders vs powers of two."""
    trace = _trace()
    budgets = list(range(1, max_graphs + 1))
    chosen = [evaluate_ladder(trace, choose_ladder(trace, n, min_hit_rate)) for n in budgets]
    full = [evaluate_ladder(trace, choose_ladder(trace, n, 1.0)) for n in budgets]
    naive = [evaluate_ladder(trace, powers_of_two_ladder(n)) for n in budgets]
    fig = Figure(figsize=(7.6, 3.4))
    left, right = fig.subplots(1, 2)
    left.plot(
        budgets,
        [s.hit_rate * 100 for s in chosen],
        "o-",
        color=_CHOSEN_COLOR,
        label=f"chosen, ≥{min_hit_rate:.0%}",
    )
    left.plot(
        budgets,
        [s.hit_rate * 100 for s in full],
        "s:",
        color=_CHOSEN_COLOR,
        alpha=0.6,
        label="chosen, 100%",
    )
    left.plot(
        budgets, [s.hit_rate * 100 for s in naive], "^--", color=_NAIVE_COLOR, label="powers of two"
    )
    left.axhline(min_hit_rate * 100, color=_TAIL_COLOR, lw=1)
    left.axhline(85, color=_TAIL_COLOR, lw=1, ls=":")
    left.text(
        max_graphs,
        min_hit_rate * 100 - 5,
        f"required {min_hit_rate:.0%}",
        ha="right",
        fontsize=8,
        color=_TAIL_COLOR,
    )
    left.text(
        max_graphs, 85 - 7, "case study's alert 85%", ha="right", fontsize=8, color=_TAIL_COLOR
    )
    left.set_ylim(0, 105)
    left.set_xlabel("graphs captured (rungs)")
    left.set_ylabel("decode graph hit rate (%)")
    left.set_title("Hit rate")
    left.legend(loc="center right", frameon=False)
    right.plot(
        budgets,
        [s.padding_waste * 100 for s in chosen],
        "o-",
        color=_CHOSEN_COLOR,
        label=f"chosen, ≥{min_hit_rate:.0%}",
    )
    right.plot(
        budgets,
        [s.padding_waste * 100 for s in full],
        "s:",
        color=_CHOSEN_COLOR,
        alpha=0.6,
        label="chosen, 100%",
    )
    right.plot(
        budgets,
        [s.padding_waste * 100 for s in naive],
        "^--",
        color=_NAIVE_COLOR,
        label="powers of two",
    )
    right.set_yscale("symlog", linthresh=1)  # log above 1%, linear below: 0% stays visible
    right.set_ylim(0, 300)
    right.set_xlabel("graphs captured (rungs)")
    right.set_ylabel("padding waste (% of real tokens)")
    right.set_title("Padding waste (log scale above 1%)")
    right.legend(loc="lower right", frameon=False)
    for ax in (left, right):
        ax.set_xticks(budgets)
    fig.suptitle(
        f"Ladders for the recorded decode trace ({len(trace)} steps), 1 to {max_graphs} graphs",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


@styled
def ttft_vs_itl_figure() -> Figure:
    """TTFT and inter-token latency of the recorded run,
    and why: steps that carry a prefill are long."""
    run = recorded_run()
    ttft, itl = np.array(run["ttft_ms"]), np.array(run["itl_ms"])
    steps = np.array(run["steps"], dtype=float)  # tokens, prefill tokens, uniform decode, ms
    fig = Figure(figsize=(7.6, 3.4))
    left, right = fig.subplots(1, 2)
    bins = np.geomspace(
        max(0.1, min(ttft.min(), itl.min()) * 0.9), max(ttft.max(), itl.max()) * 1.1, 40
    )
    left.hist(
        itl,
        bins=bins,
        weights=np.full(len(itl), 100 / len(itl)),
        color=_CHOSEN_COLOR,
        alpha=0.6,
        label=f"ITL ({len(itl)} gaps)",
    )
    left.hist(
        ttft,
        bins=bins,
        weights=np.full(len(ttft), 100 / len(ttft)),
        color=_PREFILL_COLOR,
        alpha=0.6,
        label=f"TTFT ({len(ttft)} requests)",
    )
    for values, color in ((itl, _CHOSEN_COLOR), (ttft, _PREFILL_COLOR)):
        p50, p99 = np.percentile(values, [50, 99])
        left.axvline(p50, color=color, lw=1.2)
        left.axvline(p99, color=color, lw=1.2, ls="--")
    left.set_xscale("log")
    left.set_xlabel("milliseconds (log scale); solid P50, dashed P99")
    left.set_ylabel("share of its samples in the bin (%)")
    left.set_title("TTFT and ITL: two distributions")
    left.legend(loc="upper left", frameon=False)
    decode = steps[:, 2] == 1
    right.scatter(
        steps[decode, 0], steps[decode, 3], s=6, color=_CHOSEN_COLOR, alpha=0.5, label="decode only"
    )
    right.scatter(
        steps[~decode, 0],
        steps[~decode, 3],
        s=6,
        color=_PREFILL_COLOR,
        alpha=0.5,
        label="with a prefill",
    )
    right.set_xscale("log")
    right.set_xlabel("tokens in the step (log scale)")
    right.set_ylabel("step time (ms)")
    right.set_title("A step with a prefill lengthens every ITL")
    right.legend(loc="upper left", frameon=False)
    fig.suptitle(
        "tiny model on CPU, recorded run of labs/phase-06/lab-01-capture-ladder",
        fontsize=8,
        y=0.02,
        va="bottom",
    )
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def serve_table(path: str | Path = SERVE_RESULTS) -> list[dict[str, str]]:
    """The rows of the results file's first table (configuration x request rate), as
    {column header: cell}; the table whose header starts with `| configuration | rate`."""
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            if header is not None and rows:
                break  # the end of the first table
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            if cells[:2] == ["configuration", "rate (req/s)"]:
                header = cells
        elif not re.fullmatch(r"-+", cells[0]):
            rows.append(dict(zip(header, cells)))
    if not rows:
        raise ValueError(f"{path}: no table with the columns configuration, rate (req/s)")
    return rows


_SERVE_COLORS = {"eager": _NAIVE_COLOR, "full_and_piecewise": _CHOSEN_COLOR}
_SERVE_NAMES = {
    "eager": "eager",
    "full_and_piecewise": "CUDA graphs (FULL_AND_PIECEWISE)",
    "compile+full_and_piecewise+async": "compiled + graphs + async",
}


@styled
def serve_itl_figure(path: str | Path = SERVE_RESULTS) -> Figure:
    """ITL P50 and P99 of each configuration at each request rate, from the H100 serving
    benchmark: solid bars the P50, the light bar behind each the P99 (log scale)."""
    rows = serve_table(path)
    configs = list(dict.fromkeys(r["configuration"] for r in rows))
    rates = list(dict.fromkeys(r["rate (req/s)"] for r in rows))
    cell = {(r["configuration"], r["rate (req/s)"]): r for r in rows}
    fig = Figure(figsize=(7.6, 4.2))
    ax = fig.add_subplot()
    width = 0.8 / len(configs)
    for i, config in enumerate(configs):
        color = _SERVE_COLORS.get(config, "#1e8449")
        xs, p50, p99, shown = [], [], [], []
        for k, rate in enumerate(rates):
            row = cell.get((config, rate))
            if row is None:
                continue
            xs.append(k + (i - (len(configs) - 1) / 2) * width)
            p50.append(float(row["ITL P50 ms"]))
            p99.append(float(row["ITL P99 ms"]))
            shown.append((row["ITL P50 ms"], row["ITL P99 ms"]))  # as the file writes them
        name = _SERVE_NAMES.get(config, config)
        ax.bar(xs, p99, width * 0.9, color=color, alpha=0.3, label=f"{name}: P99")
        ax.bar(xs, p50, width * 0.9, color=color, label=f"{name}: P50")
        for x, a, b, (a_text, b_text) in zip(xs, p50, p99, shown):
            ax.text(x, a * 1.08, a_text, ha="center", va="bottom", fontsize=7)
            ax.text(x, b * 1.08, b_text, ha="center", va="bottom", fontsize=7, color="#555555")
    ax.axhline(230, color=_TAIL_COLOR, lw=1, ls="--")
    ax.text(
        len(rates) - 0.5,
        230 * 2.4,
        "dashed: a step that admits a prompt, run without a graph, about 230 ms",
        ha="right",
        va="bottom",
        fontsize=7,
        color=_TAIL_COLOR,
    )
    ax.set_yscale("log")
    ax.set_ylim(0.5, 1500)
    ax.set_xticks(range(len(rates)))
    ax.set_xticklabels([f"{r} requests/s" if r != "inf" else "all at once (inf)" for r in rates])
    ax.set_xlabel("request rate (Poisson arrivals, 100 requests)")
    ax.set_ylabel("inter-token latency (ms, log scale)")
    ax.set_title("Served on an H100 (SmolLM2-135M shape): ITL P50 (solid) and P99 (light)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False, fontsize=7)
    fig.suptitle(
        "benchmarks/results/serve-cuda-h100.md", fontsize=7, x=0.99, y=0.01, ha="right", va="bottom"
    )
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    return fig


FIGURES: dict[str, Callable[[], Figure]] = {
    "decode-trace-ladder.png": trace_ladder_figure,
    "ladder-tradeoff.png": ladder_tradeoff_figure,
    "serve-itl-h100.png": serve_itl_figure,
    "ttft-vs-itl.png": ttft_vs_itl_figure,
}


def main(argv: Sequence[str] | None = None) -> int:
    return _draw(FIGURES, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main())
