#!/usr/bin/env python3
"""Draw the figure of the Phase 02 chapter by running mini_vllm's block manager and scheduler.

    .venv/bin/python scripts/figures/phase02.py              # into book/src/figures/
    .venv/bin/python scripts/figures/phase02.py --only kv-reserved-vs-paged.png --out-dir /tmp

One seeded load of 64 requests of mixed lengths goes through the real `Scheduler` and
`BlockManager` twice, with the same KV cache of 16,384 token slots: once cut into blocks
of 16 tokens (paging), once cut into blocks of `max_model_len` tokens. A block of
`max_model_len` tokens is exactly a contiguous per-request reservation: one block a
request, taken whole at admission. A stand-in model samples a fixed token, so requests
stop only at `max_tokens`; no timing is involved and the PNG is deterministic. Same
pattern as scripts/figures/phase05.py: one function per figure, a `FIGURES` dict.
"""

from __future__ import annotations

import functools
import random
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
from figurekit import draw as _draw
from figurekit import styled  # also puts the checkout on sys.path
from matplotlib.figure import Figure

from mini_vllm.engine.block_manager import BlockManager
from mini_vllm.engine.scheduler import Scheduler, SchedulerConfig
from mini_vllm.engine.sequence import Sequence as Request
from mini_vllm.sampling_params import SamplingParams

__all__ = ["FIGURES", "CacheRun", "kv_reserved_vs_paged_figure", "mixed_load", "run_cache"]

CACHE_SLOTS = 16_384  # token slots in the KV cache, for both layouts
MAX_MODEL_LEN = 2048
PAGED_BLOCK = 16
NUM_REQUESTS = 64
BYTES_PER_TOKEN_SMOLLM2_BF16 = 2 * 30 * 3 * 64 * 2  # K and V, layers, KV heads, head dim, bf16
_PAGED_COLOR = "#2471a3"
_CONTIGUOUS_COLOR = "#c0392b"


def mixed_load(seed: int = 0, n: int = NUM_REQUESTS) -> list[tuple[list[int], int]]:
    """`n` seeded requests: a prompt of 16..512 token ids and 16..1024 tokens to generate."""
    rng = random.Random(seed)
    load = []
    for _ in range(n):
        prompt = [rng.randrange(3, 1000) for _ in range(rng.randint(16, 512))]
        load.append((prompt, rng.randint(16, 1024)))
    return load


class CacheRun(NamedTuple):
    """Per step of one run: requests in the batch, token slots held by blocks, slots holding K/V;
    and over the run, the preemptions and the prompt tokens computed (recomputes included)."""

    block_size: int
    running: list[int]
    held_slots: list[int]
    used_slots: list[int]
    num_preemptions: int
    prefill_tokens: int

    @property
    def num_steps(self) -> int:
        return len(self.running)

    @property
    def utilisation(self) -> float:
        """Share of the held (or reserved) slots that hold a token, over the whole run."""
        return sum(self.used_slots) / sum(self.held_slots)


@functools.lru_cache(maxsize=4)
def run_cache(block_size: int, seed: int = 0) -> CacheRun:
    """The load through the real scheduler with a cache of CACHE_SLOTS slots in `block_size`s."""
    blocks = BlockManager(CACHE_SLOTS // block_size, block_size)
    config = SchedulerConfig(
        max_num_seqs=NUM_REQUESTS, max_num_batched_tokens=2048, max_model_len=MAX_MODEL_LEN
    )
    scheduler = Scheduler(config, blocks)
    for i, (prompt, max_tokens) in enumerate(mixed_load(seed)):
        scheduler.add_request(
            Request(i, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        )
    running, held, used = [], [], []
    prefill_tokens = 0
    while scheduler.has_unfinished_requests():
        output = scheduler.schedule()
        # What the step's forward sees: the blocks held, and the tokens whose K/V is in
        # them once this step has written its own.
        running.append(output.num_reqs)
        held.append(blocks.num_used_blocks * block_size)
        used.append(sum(row.context_len for row in output.scheduled))
        prefill_tokens += sum(row.num_new_tokens for row in output.scheduled if row.is_prefill)
        sampled = [7 if row.samples_token else None for row in output.scheduled]
        scheduler.update_from_output(output, sampled)
    return CacheRun(block_size, running, held, used, scheduler.num_preemptions, prefill_tokens)


@styled
def kv_reserved_vs_paged_figure() -> Figure:
    """KV slots reserved or held vs slots holding a token, and requests running, per step."""
    paged, contiguous = run_cache(PAGED_BLOCK), run_cache(MAX_MODEL_LEN)
    fig = Figure(figsize=(7.6, 5.4))
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    for run, color, name in (
        (contiguous, _CONTIGUOUS_COLOR, f"contiguous ({MAX_MODEL_LEN} slots a request)"),
        (paged, _PAGED_COLOR, f"paged (blocks of {PAGED_BLOCK})"),
    ):
        steps = np.arange(run.num_steps)
        top.plot(steps, np.array(run.held_slots) / 1000, color=color, lw=1.4, label=f"{name}: held")
        top.fill_between(
            steps,
            np.array(run.used_slots) / 1000,
            color=color,
            alpha=0.25,
            lw=0,
            label=f"{name}: holding a token ({run.utilisation:.0%})",
        )
        preempted = f", {run.num_preemptions} preemptions" if run.num_preemptions else ""
        bottom.plot(
            steps,
            run.running,
            color=color,
            lw=1.2,
            label=f"{name}: at most {max(run.running)} at once, done in {run.num_steps} "
            f"steps{preempted},\n    {run.prefill_tokens:,} prompt tokens computed",
        )
    mib = CACHE_SLOTS * BYTES_PER_TOKEN_SMOLLM2_BF16 / 2**20
    top.axhline(CACHE_SLOTS / 1000, color="#7f8c8d", lw=0.8, ls=":")
    top.text(
        contiguous.num_steps,
        CACHE_SLOTS / 1000 * 1.02,
        f"the cache: {CACHE_SLOTS:,} slots ({mib:.0f} MiB for SmolLM2-135M in bf16)",
        ha="right",
        va="bottom",
        fontsize=8,
        color="#7f8c8d",
    )
    top.set_ylim(0, CACHE_SLOTS / 1000 * 1.12)
    top.set_ylabel("KV token slots (thousands)")
    top.set_title(
        f"{NUM_REQUESTS} requests of mixed lengths (32 to 1,536 tokens), one KV cache, two layouts"
    )
    top.legend(loc="center right", frameon=False, fontsize=7.5)
    bottom.set_ylim(0, NUM_REQUESTS * 1.05)
    bottom.set_xlabel("scheduler step")
    bottom.set_ylabel("requests in the batch")
    bottom.legend(loc="upper right", frameon=False, fontsize=7.5)
    fig.tight_layout()
    return fig


FIGURES: dict[str, Callable[[], Figure]] = {
    "kv-reserved-vs-paged.png": kv_reserved_vs_paged_figure,
}


def main(argv: Sequence[str] | None = None) -> int:
    return _draw(FIGURES, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main())
