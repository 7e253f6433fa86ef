"""Phase 06, lab 01 — choose a capture ladder from a recorded trace (your code).

Mirrors mini_vllm/bench/ladder.py. vLLM takes its ladder as given (`cudagraph_capture_sizes`
in vllm/config/compilation.py) and captures it in `GPUModelRunner.capture_model`;
here you choose one from traffic and score it with the engine's own accounting
(`CudagraphDispatcher.dispatch` and `EngineStats`).
Run: pytest labs/phase-06/lab-01-capture-ladder
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mini_vllm.config.capture_sizes import padded_size  # noqa: F401  (Phase 05's rung lookup: use it)
from mini_vllm.config.compilation import CUDAGraphMode
from mini_vllm.engine.cudagraph_dispatcher import CudagraphDispatcher  # noqa: F401
from mini_vllm.engine.stats import EngineStats, StepRecord  # noqa: F401

DEFAULT_MIN_HIT_RATE = 0.92


def trace_from_stats(stats: EngineStats) -> list[int]:
    """The decode batch sizes of a run, in step order.

    Keep only the uniform-decode steps (`StepRecord.uniform_decode`), and take each
    one's `num_tokens`. Mixed steps (with a prefill) are not part of the trace.
    """
    raise NotImplementedError("TODO: one list comprehension over stats.steps")


@dataclass(frozen=True)
class LadderScore:
    """Given: what a ladder does to a trace of decode steps."""

    ladder: tuple[int, ...]  # the rungs, ascending
    decode_steps: int  # steps in the trace
    graph_steps: int  # steps at or below the top rung: they replay a graph
    real_tokens: int  # tokens the steps held
    padding_tokens: int  # tokens added to reach a rung (steps above the ladder add none)

    @property
    def num_graphs(self) -> int:
        return len(self.ladder)

    @property
    def hit_rate(self) -> float:
        return self.graph_steps / self.decode_steps if self.decode_steps else 0.0

    @property
    def padding_waste(self) -> float:
        return self.padding_tokens / self.real_tokens if self.real_tokens else 0.0


def powers_of_two_ladder(num_graphs: int) -> list[int]:
    """Given: the naive ladder 1, 2, 4, ..., 2**(num_graphs - 1)."""
    if num_graphs < 1:
        raise ValueError(f"a ladder has at least one rung, got {num_graphs}")
    return [2**i for i in range(num_graphs)]


def _histogram(trace: Mapping[int, int] | Iterable[int]) -> Counter:
    """Given: {batch size: steps} from a list of sizes or a mapping."""
    if isinstance(trace, Mapping):
        return Counter({int(k): int(v) for k, v in trace.items() if v > 0})
    return Counter(int(b) for b in trace)


def evaluate_ladder(trace: Mapping[int, int] | Iterable[int], ladder: Iterable[int]) -> LadderScore:
    """Score `ladder` (any order, maybe with duplicates) on a trace.

    For each step: `padded_size(size, rungs)` is its rung, or None above the ladder.
    A step with a rung is a graph step and adds `rung - size` padding tokens; a step
    without one runs eagerly and adds nothing. Every step adds `size` real tokens.
    Return a LadderScore whose `ladder` is the sorted, de-duplicated rungs as a tuple.
    """
    raise NotImplementedError("TODO: walk the histogram, look each size up")


def score_with_engine(
    trace: Iterable[int],
    ladder: Iterable[int],
    cudagraph_mode: CUDAGraphMode | str = CUDAGraphMode.FULL_AND_PIECEWISE,
    max_num_seqs: int | None = None,
) -> EngineStats:
    """Replay a decode trace through the engine's own dispatcher and statistics.

    Build `CudagraphDispatcher(cudagraph_mode, sorted rungs, max_num_seqs)`
    (max_num_seqs None: the largest of the trace and the rungs). For each size call
    `dispatcher.dispatch(size, uniform_decode=True)` -> (mode, descriptor) and record a
    StepRecord as the model runner does: num_reqs = num_tokens = num_decode_tokens =
    size, num_padded_tokens = descriptor.num_tokens, num_prefill_tokens = 0,
    uniform_decode = True, runtime_mode = mode.name, seconds = 0.0.
    Do not look rungs up yourself: the dispatcher decides.
    """
    raise NotImplementedError("TODO: one dispatch and one StepRecord per step")


def choose_ladder(
    trace: Mapping[int, int] | Iterable[int],
    max_graphs: int,
    min_hit_rate: float = DEFAULT_MIN_HIT_RATE,
    max_capture_size: int | None = None,
) -> list[int]:
    """The ascending ladder of at most `max_graphs` rungs, each <= `max_capture_size`
    (None: no limit), with hit rate >= `min_hit_rate` on the trace and the least
    padding possible.

    1. ValueError if max_graphs < 1, min_hit_rate is outside [0, 1], or the trace is empty.
    2. The top rung: the smallest size s of the trace such that the steps <= s are at
       least min_hit_rate of all steps. If s > max_capture_size: ValueError, saying
       which share of steps is reachable.
    3. Below it, choose the other rungs among the sizes the trace holds, minimising
       the padding: dynamic programming over the sorted distinct sizes
       best[k][i] = least padding serving sizes[0..i] with k rungs, the top at sizes[i].
    """
    raise NotImplementedError("TODO: top rung, then the DP, then walk back")
