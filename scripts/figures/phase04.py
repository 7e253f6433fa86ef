#!/usr/bin/env python3
"""Draw the figure of the Phase 04 chapter from one real step of mini_vllm's scheduler and inputs.

    .venv/bin/python scripts/figures/phase04.py              # into book/src/figures/
    .venv/bin/python scripts/figures/phase04.py --only flat-inputs.png --out-dir /tmp

The step is the one of the Phase 04 exercises: block size 4, `BlockManager(12, 4)`,
`max_num_seqs = 4`, `max_num_batched_tokens = 10`. Step 0 computes A's 5-token prompt and
the first 5 tokens of B's 8-token prompt; then C (9 tokens) arrives. Step 1 mixes a decode
(A), the end of a prompt (B) and the first chunk of another (C). The figure draws the
`ModelInputs` that `prepare_inputs` builds for step 1, padded by `pad_inputs` to 16 tokens
as for a piecewise graph, and the KV-cache slots its slot mapping writes. Nothing is timed
and nothing is random, so the PNG is deterministic. Same pattern as
scripts/figures/phase05.py: one function per figure, a `FIGURES` dict.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence

from figurekit import draw as _draw
from figurekit import styled  # also puts the checkout on sys.path
from matplotlib import patches
from matplotlib.figure import Figure

from mini_vllm.engine.block_manager import PAD_SLOT_ID, BlockManager
from mini_vllm.engine.model_inputs import ModelInputs, pad_inputs, prepare_inputs
from mini_vllm.engine.scheduler import Scheduler, SchedulerConfig
from mini_vllm.engine.scheduler_output import SchedulerOutput
from mini_vllm.engine.sequence import Sequence as Request
from mini_vllm.sampling_params import SamplingParams

__all__ = ["FIGURES", "PADDED_SIZE", "example_step", "flat_inputs_figure"]

BLOCK_SIZE, NUM_BLOCKS = 4, 12
PADDED_SIZE = 16  # the capture size the mixed step is padded to
_COLORS = {"A": "#2471a3", "B": "#d68910", "C": "#229954", None: "#95a5a6"}
_PALE = {"A": "#d4e6f1", "B": "#fae5d3", "C": "#d5f5e3"}


@functools.lru_cache(maxsize=1)
def example_step() -> tuple[SchedulerOutput, ModelInputs, ModelInputs, dict[str, int]]:
    """Step 1 of the exercises' engine: its output, its inputs, the padded inputs, and how
    many tokens each request had in the cache before the step."""
    blocks = BlockManager(NUM_BLOCKS, BLOCK_SIZE)
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=10, max_model_len=32)
    scheduler = Scheduler(config, blocks)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    scheduler.add_request(Request("A", range(11, 16), params))
    scheduler.add_request(Request("B", range(20, 28), params))
    step0 = scheduler.schedule()
    scheduler.update_from_output(step0, [50 if r.samples_token else None for r in step0.scheduled])
    scheduler.add_request(Request("C", range(40, 49), params))
    step1 = scheduler.schedule()
    before = {row.seq_id: row.num_computed_tokens for row in step1.scheduled}
    inputs = prepare_inputs(step1)
    return step1, inputs, pad_inputs(inputs, PADDED_SIZE), before


def _row_label(row) -> str:
    if not row.is_prefill:
        return f"{row.seq_id}: decode"
    if row.samples_token:
        return f"{row.seq_id}: end of prompt"
    return f"{row.seq_id}: prompt chunk"


@styled
def flat_inputs_figure() -> Figure:
    """One mixed step's flat inputs (token by token) and the cache slots its slot mapping writes."""
    output, inputs, padded, before = example_step()
    owner: list[str | None] = [
        row.seq_id for row in output.scheduled for _ in range(row.num_new_tokens)
    ]
    owner += [None] * (padded.num_tokens - inputs.num_tokens)
    fig = Figure(figsize=(7.8, 6.4))
    grid, cache = fig.subplots(2, 1, gridspec_kw={"height_ratios": [1.25, 1]})

    # --- the flat batch: one column a token --------------------------------------------
    fields = [
        ("input_ids", padded.input_ids),
        ("positions", padded.positions),
        ("slot_mapping", padded.slot_mapping),
    ]
    for y, (name, values) in enumerate(reversed(fields)):
        grid.text(-0.2, y + 0.5, name, ha="right", va="center", family="monospace", fontsize=8)
        for x, value in enumerate(values):
            seq = owner[x]
            grid.add_patch(
                patches.Rectangle(
                    (x, y),
                    0.94,
                    0.9,
                    facecolor=_COLORS[seq] if seq else "white",
                    edgecolor=_COLORS[seq],
                    alpha=0.85 if seq else 1.0,
                    hatch=None if seq else "///",
                )
            )
            grid.text(
                x + 0.47,
                y + 0.45,
                str(value),
                ha="center",
                va="center",
                fontsize=8,
                color="white" if seq else "black",
            )
    top = len(fields)
    starts = inputs.query_start_loc
    for r, row in enumerate(output.scheduled):
        a, b = starts[r], starts[r + 1]
        grid.plot([a + 0.03, b - 0.09], [top + 0.25] * 2, color=_COLORS[row.seq_id], lw=2)
        if r % 2:
            grid.plot(
                [(a + b) / 2 - 0.03] * 2, [top + 0.25, top + 1.3], color=_COLORS[row.seq_id], lw=0.8
            )
        grid.text(
            (a + b) / 2 - 0.03,
            top + 0.4 + 0.95 * (r % 2),  # narrow rows: labels on two levels
            f"{_row_label(row)}\n{row.num_new_tokens} token{'s' * (row.num_new_tokens > 1)}",
            ha="center",
            va="bottom",
            fontsize=7.5,
            color=_COLORS[row.seq_id],
        )
    pad_start = inputs.num_tokens
    grid.text(
        (pad_start + padded.num_tokens) / 2,
        top + 0.4,
        f"padding to {PADDED_SIZE}\n(pad_inputs: slot {PAD_SLOT_ID})",
        ha="center",
        va="bottom",
        fontsize=7.5,
        color="#566573",
    )
    for s in starts:
        grid.plot([s - 0.03, s - 0.03], [-0.15, top + 0.1], color="black", lw=0.8, ls="--")
        grid.text(s - 0.03, -0.3, str(s), ha="center", va="top", fontsize=7.5)
    grid.text(-0.2, -0.3, "query_start_loc", ha="right", va="top", family="monospace", fontsize=8)
    for index in inputs.logits_indices:
        grid.annotate(
            "",
            xy=(index + 0.47, -0.05),
            xytext=(index + 0.47, -0.95),
            arrowprops=dict(arrowstyle="->", color="black", lw=1),
        )
    grid.text(
        -0.2,
        -1.05,
        "logits_indices",
        ha="right",
        va="center",
        family="monospace",
        fontsize=8,
    )
    grid.text(
        max(inputs.logits_indices) + 1.2,
        -1.05,
        f"{inputs.logits_indices}: the last token of each row that reaches its end samples; "
        "C's chunk does not",
        va="center",
        fontsize=7.5,
    )
    grid.set_xlim(-3.2, padded.num_tokens + 0.2)
    grid.set_ylim(-1.5, top + 2.2)
    grid.axis("off")
    grid.set_title(
        "One mixed step flattened by prepare_inputs: a column a token "
        f"(block size {BLOCK_SIZE}, budget 10 tokens)"
    )

    # --- the KV cache: one column a block, one cell a slot -------------------------------
    held = {row.seq_id: row.block_table for row in output.scheduled}
    block_owner = {b: seq for seq, table in held.items() for b in table}
    written = {slot: t for t, slot in enumerate(inputs.slot_mapping)}
    for block in range(NUM_BLOCKS + 1):
        scratch = block == NUM_BLOCKS
        seq = block_owner.get(block)
        for offset in range(BLOCK_SIZE):
            slot = block * BLOCK_SIZE + offset
            y = BLOCK_SIZE - 1 - offset
            if scratch:
                face, edge, hatch, text = "white", "#566573", "///", ""
            elif slot in written:
                face, edge, hatch, text = _COLORS[seq], _COLORS[seq], None, f"t{written[slot]}"
            elif seq is not None:
                position = held[seq].index(block) * BLOCK_SIZE + offset
                cached = position < before[seq]
                face = _PALE[seq] if cached else "white"
                edge, hatch, text = _COLORS[seq], None, "" if not cached else "·"
            else:
                face, edge, hatch, text = "white", "#bfc9ca", None, ""
            cache.add_patch(
                patches.Rectangle(
                    (block, y), 0.9, 0.9, facecolor=face, edgecolor=edge, hatch=hatch, lw=0.8
                )
            )
            if text:
                cache.text(
                    block + 0.45,
                    y + 0.45,
                    text,
                    ha="center",
                    va="center",
                    fontsize=7.5,
                    color="white" if text.startswith("t") else "black",
                )
        label = "scratch" if scratch else f"{block}"
        cache.text(block + 0.45, -0.25, label, ha="center", va="top", fontsize=7.5)
        if seq is not None:
            cache.text(
                block + 0.45,
                BLOCK_SIZE + 0.1,
                seq,
                ha="center",
                va="bottom",
                fontsize=8,
                color=_COLORS[seq],
            )
    cache.text(-0.2, -0.25, "block", ha="right", va="top", fontsize=7.5)
    cache.text(
        -0.2, BLOCK_SIZE / 2, "slot offset\n0 (top) to 3", ha="right", va="center", fontsize=7.5
    )
    tables = "   ".join(
        f"{row.seq_id}: table {list(row.block_table)}, seq_len {row.context_len}"
        for row in output.scheduled
    )
    cache.text(
        NUM_BLOCKS / 2,
        -1.0,
        f"block_tables and seq_lens per row:   {tables}",
        ha="center",
        va="top",
        fontsize=7.5,
    )
    cache.text(
        NUM_BLOCKS / 2,
        -1.7,
        "tN: slot written this step by flat token N;  ·: K/V computed in an earlier step;  "
        "hatched: the scratch block that takes the slot -1 writes",
        ha="center",
        va="top",
        fontsize=7.5,
        color="#566573",
    )
    cache.set_xlim(-2.2, NUM_BLOCKS + 1.2)
    cache.set_ylim(-2.4, BLOCK_SIZE + 0.8)
    cache.set_aspect("equal")
    cache.axis("off")
    cache.set_title(
        f"The paged KV cache ({NUM_BLOCKS} blocks of {BLOCK_SIZE} slots): where slot_mapping sends "
        "each token's K/V",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


FIGURES: dict[str, Callable[[], Figure]] = {
    "flat-inputs.png": flat_inputs_figure,
}


def main(argv: Sequence[str] | None = None) -> int:
    return _draw(FIGURES, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main())
