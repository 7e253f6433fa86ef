#!/usr/bin/env python3
"""Draw the figure of the Phase 03 chapter by running mini_vllm's scheduler on a seeded load.

    .venv/bin/python scripts/figures/phase03.py              # into book/src/figures/
    .venv/bin/python scripts/figures/phase03.py --only scheduler-timeline.png --out-dir /tmp

200 seeded requests arrive at once and go through the real `Scheduler` and `BlockManager`
twice, with the same limits and two KV caches: one large enough for every running
request, one small enough to force preemptions. A stand-in model samples a fixed token,
so requests stop only at `max_tokens` and the scheduler's decisions are the only thing
drawn; no timing is involved and the PNG is deterministic. Same pattern as
scripts/figures/phase05.py: one function per figure, a `FIGURES` dict.
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

__all__ = ["FIGURES", "LIMITS", "QueueTrace", "scheduler_timeline_figure", "trace_load"]

NUM_REQUESTS = 200
BLOCK_SIZE = 16
LIMITS = SchedulerConfig(max_num_seqs=32, max_num_batched_tokens=256, max_model_len=256)
LARGE_CACHE, SMALL_CACHE = 512, 96  # blocks of 16 tokens
_LARGE_COLOR = "#2471a3"
_SMALL_COLOR = "#c0392b"


class QueueTrace(NamedTuple):
    """Per step: requests running and waiting once the step is planned, preemptions, whether
    the step is uniform decode; over the run, the prompt tokens computed (recomputes included)."""

    num_blocks: int
    running: list[int]
    waiting: list[int]
    preempted: list[int]
    uniform_decode: list[bool]
    prefill_tokens: int

    @property
    def num_steps(self) -> int:
        return len(self.running)


@functools.lru_cache(maxsize=4)
def trace_load(num_blocks: int, seed: int = 0) -> QueueTrace:
    """The seeded load (prompts of 8..96 tokens, 8..128 new tokens) through the scheduler."""
    rng = random.Random(seed)
    scheduler = Scheduler(LIMITS, BlockManager(num_blocks, BLOCK_SIZE))
    for i in range(NUM_REQUESTS):
        prompt = [rng.randrange(3, 1000) for _ in range(rng.randint(8, 96))]
        params = SamplingParams(max_tokens=rng.randint(8, 128), ignore_eos=True)
        scheduler.add_request(Request(i, prompt, params))
    running, waiting, preempted, uniform = [], [], [], []
    prefill_tokens = 0
    while scheduler.has_unfinished_requests():
        output = scheduler.schedule()
        r, w = scheduler.get_request_counts()
        running.append(r)
        waiting.append(w)
        preempted.append(len(output.preempted_ids))
        uniform.append(output.is_uniform_decode)
        prefill_tokens += sum(row.num_new_tokens for row in output.scheduled if row.is_prefill)
        sampled = [7 if row.samples_token else None for row in output.scheduled]
        scheduler.update_from_output(output, sampled)
    return QueueTrace(num_blocks, running, waiting, preempted, uniform, prefill_tokens)


@styled
def scheduler_timeline_figure() -> Figure:
    """Running and waiting requests per step, and preemptions, for a large and a small cache."""
    runs = [(trace_load(LARGE_CACHE), _LARGE_COLOR), (trace_load(SMALL_CACHE), _SMALL_COLOR)]
    fig = Figure(figsize=(7.6, 6.0))
    axes = fig.subplots(3, 1, sharex=True, gridspec_kw={"height_ratios": [2, 2, 1.3]})
    running_ax, waiting_ax, preempt_ax = axes
    for trace, color in runs:
        steps = np.arange(trace.num_steps)
        cache = f"{trace.num_blocks} blocks ({trace.num_blocks * BLOCK_SIZE:,} tokens)"
        uniform = sum(trace.uniform_decode)
        running_ax.step(
            steps,
            trace.running,
            where="post",
            color=color,
            lw=1.1,
            label=f"cache of {cache}: {trace.num_steps} steps, {uniform} of them uniform decode",
        )
        waiting_ax.step(steps, trace.waiting, where="post", color=color, lw=1.3, label=cache)
        preempt_ax.step(
            steps,
            np.cumsum(trace.preempted),
            where="post",
            color=color,
            lw=1.3,
            label=f"{cache}: {sum(trace.preempted)} preemptions, "
            f"{trace.prefill_tokens:,} prompt tokens computed",
        )
    running_ax.axhline(LIMITS.max_num_seqs, color="#7f8c8d", lw=0.8, ls=":")
    running_ax.text(
        runs[0][0].num_steps + 10,
        LIMITS.max_num_seqs + 0.8,
        f"max_num_seqs = {LIMITS.max_num_seqs}",
        ha="left",
        va="bottom",
        fontsize=8,
        color="#7f8c8d",
    )
    running_ax.set_ylim(0, LIMITS.max_num_seqs * 1.5)
    running_ax.set_ylabel("requests running")
    running_ax.legend(loc="upper right", frameon=False, fontsize=7.5)
    running_ax.set_title(
        f"{NUM_REQUESTS} requests at once through the scheduler, two KV caches\n"
        f"(budget {LIMITS.max_num_batched_tokens} tokens a step, blocks of {BLOCK_SIZE} tokens)"
    )
    waiting_ax.set_ylim(0, NUM_REQUESTS * 1.05)
    waiting_ax.set_ylabel("requests waiting")
    waiting_ax.legend(loc="upper right", frameon=False, fontsize=7.5)
    preempt_ax.set_ylabel("preemptions\n(cumulative)")
    preempt_ax.set_xlabel("scheduler step")
    preempt_ax.legend(loc="upper left", frameon=False, fontsize=7.5)
    fig.tight_layout()
    return fig


FIGURES: dict[str, Callable[[], Figure]] = {
    "scheduler-timeline.png": scheduler_timeline_figure,
}


def main(argv: Sequence[str] | None = None) -> int:
    return _draw(FIGURES, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main())
