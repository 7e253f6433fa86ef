#!/usr/bin/env python3
"""Draw the figures of the Phase 06 chapter from the recorded run and mini_vllm.bench.ladder.

    .venv/bin/python scripts/figures/phase06.py              # all figures into book/src/figures/
    .venv/bin/python scripts/figures/phase06.py --only ladder-tradeoff.png --out-dir /tmp

The numbers come from the run recorded in labs/phase-06/lab-01-capture-ladder/data/trace.json
(the tiny model served on CPU by the engine; regenerate it with the command stored in
the file) and from `mini_vllm.bench.ladder`. Reading a recorded run rather than timing a new
one keeps the PNGs deterministic. Same pattern as scripts/figures/phase05.py: one function
per figure returning a `matplotlib.figure.Figure`, a fixed style, and a `FIGURES` dict.
"""

from __future__ import annotations

import functools
import sys
from collections import Counter
from collections.abc import Callable, Sequence

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
    "ladder_tradeoff_figure",
    "recorded_run",
    "trace_ladder_figure",
    "ttft_vs_itl_figure",
]

TRACE_FILE = ROOT / "labs" / "phase-06/lab-01-capture-ladder" / "data" / "trace.json"
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
    left.text(max_graphs, 85 - 7, "case study's alert 85%", ha="right", fontsize=8, color=_TAIL_COLOR)
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


FIGURES: dict[str, Callable[[], Figure]] = {
    "decode-trace-ladder.png": trace_ladder_figure,
    "ladder-tradeoff.png": ladder_tradeoff_figure,
    "ttft-vs-itl.png": ttft_vs_itl_figure,
}


def main(argv: Sequence[str] | None = None) -> int:
    return _draw(FIGURES, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main())
