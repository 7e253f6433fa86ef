#!/usr/bin/env python3
"""Draw the figure of the Phase 07 chapter from the recorded tensor-parallel run.

    .venv/bin/python scripts/figures/phase07.py              # into book/src/figures/
    .venv/bin/python scripts/figures/phase07.py --only tp-step-h200.png --out-dir /tmp

One source, committed, so the PNG is deterministic: benchmarks/results/tp-cuda-h200x2.md
(`python3 scripts/gpu/tp_decode.py` on two H200s of one host), whose two tables, under the
anchors `eager` and `graphs`, give the decode step of the Llama-3.2-1B shape at one rank
and at two, at batch 1 and 32. This script reads them (`tp_step_tables`, which the Phase 07
notebook calls too) and lays them out. Same pattern as scripts/figures/phase06.py: one
function per figure returning a `matplotlib.figure.Figure`, a fixed style, a `FIGURES`
dict, and `SOURCES`, the results files each figure is drawn from.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from figurekit import ROOT, styled  # also puts the checkout on sys.path
from figurekit import draw as _draw
from headline import read_table
from matplotlib.figure import Figure

__all__ = ["FIGURES", "MODES", "SOURCES", "TP_RESULTS", "tp_step_figure", "tp_step_tables"]

TP_RESULTS = ROOT / "benchmarks" / "results" / "tp-cuda-h200x2.md"
# The anchors of the results file's two tables, and how the figure names them.
MODES = {"eager": "eager", "graphs": "CUDA graphs (FULL on every rank)"}
_TP1_COLOR = "#2471a3"
_TP2_COLOR = "#d68910"


def tp_step_tables(path: str | Path = TP_RESULTS) -> dict[str, list[dict[str, str]]]:
    """{anchor: the rows of its table}, for the anchors `eager` and `graphs`; each row a
    dict keyed by the table's header, every cell as the file writes it."""
    tables = {anchor: read_table(path, anchor) for anchor in MODES}
    for anchor, rows in tables.items():
        need = {"model", "batch", "TP=1 step ms", "TP=2 step ms", "TP=1 / TP=2"}
        if not rows or not need <= set(rows[0]):
            raise ValueError(f"{path}: the table under {anchor!r} lacks columns {sorted(need)}")
    return tables


@styled
def tp_step_figure(path: str | Path = TP_RESULTS) -> Figure:
    """The decode step at TP=1 and TP=2, eager and with graphs, at each recorded batch size:
    one panel a mode (their scales differ eightfold), the file's numbers on the bars."""
    tables = tp_step_tables(path)
    fig = Figure(figsize=(7.6, 3.9))
    axes = fig.subplots(1, len(tables))
    for ax, (anchor, rows) in zip(axes, tables.items()):
        x = np.arange(len(rows))
        width = 0.38
        top = max(float(row["TP=2 step ms"]) for row in rows)
        for offset, column, color, label in (
            (-width / 2, "TP=1 step ms", _TP1_COLOR, "TP=1: one H200"),
            (width / 2, "TP=2 step ms", _TP2_COLOR, "TP=2: two H200s, NVLink"),
        ):
            values = [float(row[column]) for row in rows]
            ax.bar(x + offset, values, width * 0.95, color=color, label=label)
            for xi, row, value in zip(x, rows, values):
                ax.text(xi + offset, value + top * 0.015, row[column], ha="center", fontsize=7.5)
        for xi, row in zip(x, rows):
            ax.text(
                xi,
                top * 1.13,
                f"TP=1 / TP=2: {row['TP=1 / TP=2']}",
                ha="center",
                fontsize=7.5,
                color="#555555",
            )
        ax.set_ylim(0, top * 1.22)
        ax.set_xticks(x, [f"batch {row['batch']}" for row in rows])
        ax.set_xlabel("decode batch size (requests in the step)")
        ax.set_ylabel("decode step (ms, median)")
        ax.set_title(MODES[anchor], fontsize=9)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower left", ncol=2, frameon=False, fontsize=8)
    model = tables["eager"][0]["model"]
    fig.suptitle(
        f"Decode step of the {model} shape (bfloat16) on one H200 and on two: TP=2 is slower",
        fontsize=10,
    )
    fig.text(
        0.99,
        0.01,
        "source: benchmarks/results/tp-cuda-h200x2.md",
        ha="right",
        va="bottom",
        fontsize=7,
        color="#555555",
    )
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


FIGURES: dict[str, Callable[[], Figure]] = {"tp-step-h200.png": tp_step_figure}
SOURCES: dict[str, list[Path]] = {"tp-step-h200.png": [TP_RESULTS]}


def main(argv: Sequence[str] | None = None) -> int:
    return _draw(FIGURES, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main())
