"""Lab 04 — inter-token latency, eager vs CUDA graphs, on a real model shape (your code).

Mirrors mini_vllm/bench/itl.py. You write the timing of decode steps (the part that
is easy to get wrong on a GPU) and the analysis of the curve; the engine set-up is
given. Without a GPU, work from the recorded H100 run in `recorded/`: the analysis
tests use it and run anywhere.
Run: pytest labs/phase-05/lab-04-graph-vs-eager-real
"""

from __future__ import annotations

import json
import statistics
import time  # noqa: F401  (for your timing code)
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch  # noqa: F401  (for your timing code)

RECORDED = Path(__file__).resolve().parent / "recorded" / "h100-itl.json"


@dataclass(frozen=True)
class ITLRow:
    """Given: one batch size's median inter-token latency in both modes."""

    batch: int
    eager_ms: float
    graph_ms: float

    @property
    def speedup(self) -> float:
        return self.eager_ms / self.graph_ms


def time_decode_steps(engine, steps: int = 20, warmup: int = 3) -> list[float]:
    """Seconds of each of `steps` calls of `engine.step()`, after `warmup` untimed calls.

    GPU work is asynchronous: a step "returns" when its kernels are launched, not when
    they finish. Read the clock only after `torch.cuda.synchronize(device)` (device:
    `engine.runner.device`; on a CPU there is nothing to wait for).
    """
    raise NotImplementedError("TODO: warm up, then time each step between two device syncs")


def speedups(rows: Iterable[ITLRow]) -> dict[int, float]:
    """{batch: eager ms / graph ms}."""
    raise NotImplementedError("TODO")


def saving_ms(rows: Iterable[ITLRow]) -> dict[int, float]:
    """{batch: eager ms - graph ms}: the time graphs save per token."""
    raise NotImplementedError("TODO")


def crossover_batch(rows: Iterable[ITLRow], threshold: float = 1.05) -> int | None:
    """The smallest measured batch size whose speed-up is below `threshold`, or None."""
    raise NotImplementedError("TODO: walk the rows in batch order")


def load_recorded(path: str | Path = RECORDED) -> tuple[dict, list[ITLRow]]:
    """Given: (metadata, rows) of the recorded run."""
    data = json.loads(Path(path).read_text())
    return data["meta"], [ITLRow(**row) for row in data["rows"]]


def measure_itl(
    model_name: str = "smollm2-135m",
    device: str = "cuda",
    batch_sizes=(1, 2, 4, 8, 16, 32, 64),
    steps: int = 20,
) -> list[ITLRow]:
    """Given: median ITL per batch size in both modes, timed with YOUR time_decode_steps."""
    from mini_vllm.bench.itl import decoding_engine
    from mini_vllm.models.loader import load_model

    model, _, _ = load_model(model_name, device=device, progress=False)
    rows = []
    for batch in batch_sizes:
        medians = {}
        for graphs in (False, True):
            engine = decoding_engine(
                model, batch, 128, steps + 5, "full_and_piecewise" if graphs else "eager"
            )
            medians[graphs] = (
                statistics.median(time_decode_steps(engine, steps=steps, warmup=3)) * 1000
            )
        rows.append(ITLRow(batch, medians[False], medians[True]))
    return rows


def vllm_itl_ms(model_dir: str, enforce_eager: bool, batch: int = 1, new_tokens: int = 64) -> float:
    """Median ms per generated token of real vLLM on `model_dir` (a Hugging Face model
    directory), with `enforce_eager` on or off. Subtract a 1-token run so prefill does
    not count. See vLLM's `LLM(..., enforce_eager=...)` and `SamplingParams(min_tokens=...)`."""
    raise NotImplementedError("TODO (optional, needs vLLM installed)")
