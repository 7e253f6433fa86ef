"""Lab 04 — inter-token latency, eager vs CUDA graphs, on a real model shape (your code).

The course's version of a latency benchmark such as vLLM's `vllm bench latency`
(vllm/benchmarks/latency.py), run once with `--enforce-eager` and once without. You
write the timing of decode steps (the part that is easy to get wrong on a GPU) and the
analysis of the curve; the engine set-up and the sweep over batch sizes are given.
Without a GPU, work from the recorded H100 run in `recorded/`: the timing tests use a
simulated GPU and the analysis tests the recorded run, and both run anywhere.
Run: pytest labs/phase-05/lab-04-graph-vs-eager-real
"""

from __future__ import annotations

import json
import statistics
import time  # noqa: F401  (the clock the tests simulate: time.perf_counter)
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch  # noqa: F401  (torch.cuda.synchronize)

from mini_vllm.bench.harness import decode_engine, start_decoding
from mini_vllm.models.loader import load_model

RECORDED = Path(__file__).resolve().parent / "recorded" / "h100-itl.json"


@dataclass(frozen=True)
class ITLRow:
    """Given: one batch size's median inter-token latency in both modes."""

    batch: int
    eager_ms: float  # median inter-token latency, eager
    graph_ms: float  # median inter-token latency, CUDA graphs

    @property
    def speedup(self) -> float:
        return self.eager_ms / self.graph_ms


# -- step 1: the timer ---------------------------------------------------------------------


def time_decode_steps(engine, steps: int = 20, warmup: int = 3) -> list[float]:
    """Seconds of each of `steps` calls of `engine.step()`, after `warmup` untimed calls.

    Guarantees:
    - `engine.step()` is called exactly `warmup + steps` times, and only the last `steps`
      calls are timed (a fresh engine's first steps pay one-off costs: allocator growth,
      lazy initialisation, the first token);
    - entry i is the wall time of timed step i, in seconds, and the clock of step i stops
      only once the device has done all of step i's work (`engine.step()` may return
      while its kernels still run on a GPU);
    - the device is the engine's own, `engine.runner.device`: a CUDA device is waited for
      with `torch.cuda.synchronize(device)`; an engine on the CPU is never waited for, and
      the timer then makes no call into CUDA;
    - the clock is `time.perf_counter()` (the tests replace it with a simulated one).
    Where the clock of a timed step starts is yours to decide (the README's step 1).

    Example, on a simulated GPU where each step takes 1 ms of CPU time to launch and then
    4 ms of GPU work: warmup=0, steps=2 gives [0.005, 0.005] (not [0.001, 0.001]: that is
    the launch time alone, the very part CUDA graphs remove).
    """
    raise NotImplementedError("TODO: one time per timed step, GPU work included")


# -- step 2: the analysis ------------------------------------------------------------------


def speedups(rows: Iterable[ITLRow]) -> dict[int, float]:
    """{batch: eager ms / graph ms}. Example: ITLRow(8, 13.0, 3.0) gives {8: 4.333...}."""
    raise NotImplementedError("TODO")


def saving_ms(rows: Iterable[ITLRow]) -> dict[int, float]:
    """{batch: eager ms - graph ms}: the time graphs save per token.
    Example: ITLRow(8, 13.0, 3.0) gives {8: 10.0}."""
    raise NotImplementedError("TODO")


def crossover_batch(rows: Iterable[ITLRow], threshold: float = 1.05) -> int | None:
    """The smallest measured batch size whose speed-up, as `speedups` gives it, is below
    `threshold` (strictly), or None if there is none. The rows may come in any order, and
    as any iterable.

    Example: speed-ups {1: 6.0, 8: 4.3, 32: 2.0, 64: 1.03} and threshold 2.5 give 32.
    """
    raise NotImplementedError("TODO")


# -- given ---------------------------------------------------------------------------------


def load_recorded(path: str | Path) -> tuple[dict, list[ITLRow]]:
    """Given: (metadata, rows) of a run recorded with `python -m mini_vllm.bench.itl --out`."""
    data = json.loads(Path(path).read_text())
    return data["meta"], [ITLRow(**row) for row in data["rows"]]


def decoding_engine(model, batch: int, context_len: int, steps: int, mode: str):
    """Given: an engine whose next `steps` steps decode `batch` requests at once, each step
    on the graph captured for `batch` (mode "eager": none)."""
    engine = decode_engine(model, mode, [batch], context_len, new_tokens=steps)
    start_decoding(engine, batch, context_len, new_tokens=steps)
    return engine


def measure_itl(
    model_name: str = "smollm2-135m",
    device: str = "cuda",
    batch_sizes: Iterable[int] = (1, 2, 4, 8, 16, 32, 64),
    steps: int = 20,
    context_len: int = 128,
    graph_mode: str = "full_and_piecewise",
) -> list[ITLRow]:
    """Given: median ITL per batch size in both modes, timed with YOUR time_decode_steps."""
    model, _, _ = load_model(model_name, device=device, progress=False)
    rows = []
    for batch in batch_sizes:
        medians = {}
        for graphs in (False, True):
            engine = decoding_engine(
                model, batch, context_len, steps + 5, graph_mode if graphs else "eager"
            )
            medians[graphs] = (
                statistics.median(time_decode_steps(engine, steps=steps, warmup=3)) * 1000
            )
            del engine
        rows.append(ITLRow(batch, eager_ms=medians[False], graph_ms=medians[True]))
    return rows


# -- step 4 (optional, needs vLLM on a CUDA machine) ---------------------------------------


def vllm_itl_ms(
    model_dir: str,
    enforce_eager: bool,
    batch: int = 1,
    new_tokens: int = 64,
    context_len: int = 128,
) -> float:
    """Median ms per generated token of real vLLM on `model_dir` (a Hugging Face model
    directory), with `enforce_eager` on or off, for `batch` prompts of `context_len`
    tokens each generating exactly `new_tokens` tokens. Prefill must not count: the
    result is per token of decode only (see vLLM's `LLM(..., enforce_eager=...)` and
    `SamplingParams(min_tokens=..., ignore_eos=...)`)."""
    raise NotImplementedError("TODO (optional, needs vLLM installed)")
