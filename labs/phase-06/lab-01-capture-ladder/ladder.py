"""Phase 06, lab 01 — choose a capture ladder from a recorded trace (your code).

vLLM takes its ladder as given (`cudagraph_capture_sizes` in vllm/config/compilation.py)
and captures it in `GPUModelRunner.capture_model`; here you choose one from traffic and
score it with the engine's own accounting (`CudagraphDispatcher.dispatch` and
`EngineStats`), so that the number you predict is the number the engine reports.
Run: pytest labs/phase-06/lab-01-capture-ladder
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mini_vllm.config.capture_sizes import padded_size  # noqa: F401  (Phase 05's rung lookup)
from mini_vllm.config.compilation import CUDAGraphMode
from mini_vllm.engine.cudagraph_dispatcher import CudagraphDispatcher  # noqa: F401
from mini_vllm.engine.stats import EngineStats, StepRecord  # noqa: F401
from mini_vllm.errors import UserError  # a ValueError whose message says what to do

DEFAULT_MIN_HIT_RATE = 0.92  # a case study's hit-rate threshold (it alerts below 0.85)


def trace_from_stats(stats: EngineStats) -> list[int]:
    """The decode batch sizes of a run, in step order: what a ladder must serve.

    Guarantees: one entry per uniform-decode step of `stats.steps`
    (`StepRecord.uniform_decode`), in order, holding that step's real token count
    (never the size it was padded to). Mixed steps (with a prefill) are left out.

    Example: steps of (num_tokens, num_padded_tokens, uniform_decode)
    (40, 40, False), (3, 4, True), (9, 9, False), (5, 8, True) -> [3, 5].
    """
    raise NotImplementedError("TODO: step 1")


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
        raise UserError(f"a ladder has at least one rung, got {num_graphs}")
    return [2**i for i in range(num_graphs)]


def _histogram(trace: Mapping[int, int] | Iterable[int]) -> Counter:
    """Given: {batch size: steps} from a list of sizes or a mapping (sizes >= 1)."""
    counts = (
        Counter({int(k): int(v) for k, v in trace.items()})
        if isinstance(trace, Mapping)
        else Counter(int(b) for b in trace)
    )
    bad = sorted(k for k, v in counts.items() if v and k < 1)
    if bad:
        raise UserError(f"batch sizes are >= 1, got {bad}")
    return Counter({k: v for k, v in counts.items() if v > 0})


def evaluate_ladder(trace: Mapping[int, int] | Iterable[int], ladder: Iterable[int]) -> LadderScore:
    """What `ladder` does to `trace` (a list of batch sizes, or {size: steps}).

    Guarantees, for the ladder given in any order and maybe with duplicates, as any
    iterable (the caller's list is left as it was):
    - `ladder` of the result: the distinct rungs, ascending, as a tuple;
    - a step runs on the smallest rung >= its size (Phase 05's `padded_size`): it is a
      graph step and adds rung - size padding tokens; a step above the top rung runs
      eagerly and adds no padding;
    - decode_steps counts every step, real_tokens every step's size.
    So `hit_rate` and `padding_waste` are the engine's `decode_graph_hit_rate` and
    `padding_waste` on these steps.

    Example: trace [3, 4, 5, 8, 1, 9], ladder [8, 4] -> ladder (4, 8), decode_steps 6,
    graph_steps 5, real_tokens 30, padding_tokens 1 + 0 + 3 + 0 + 3 = 7 (the 9 adds 0).
    """
    raise NotImplementedError("TODO: step 2")


def score_with_engine(
    trace: Iterable[int],
    ladder: Iterable[int],
    cudagraph_mode: CUDAGraphMode | str = CUDAGraphMode.FULL_AND_PIECEWISE,
    max_num_seqs: int | None = None,
) -> EngineStats:
    """The engine's own statistics for a decode trace served with `ladder` captured.

    Guarantees: one StepRecord a trace entry, in order, recorded as the model runner
    records a uniform-decode step of that size: num_reqs = num_tokens =
    num_decode_tokens = size, num_prefill_tokens = 0, uniform_decode True,
    seconds 0.0; runtime_mode (the mode's name) and num_padded_tokens (the batch
    descriptor's token count) are what the engine's `CudagraphDispatcher`, built for
    `cudagraph_mode`, the ladder's distinct rungs ascending and `max_num_seqs`,
    answers for a uniform decode of that size. The rungs are never looked up here: the
    dispatcher decides. Neither `trace`, `ladder` nor anything else the caller passed is
    changed, and each may be any iterable. Which max_num_seqs to build the dispatcher
    with when the caller gives None is yours to decide (the README's step 3).

    Example: trace [3, 8, 9, 20], ladder [4, 8, 16], max_num_seqs 16 -> padded sizes
    [4, 8, 16, 20], modes ["FULL", "FULL", "FULL", "NONE"].
    """
    raise NotImplementedError("TODO: step 3")


def choose_ladder(
    trace: Mapping[int, int] | Iterable[int],
    max_graphs: int,
    min_hit_rate: float = DEFAULT_MIN_HIT_RATE,
    max_capture_size: int | None = None,
) -> list[int]:
    """The best ladder for `trace`: ascending, distinct rungs, at most `max_graphs` of
    them, each <= `max_capture_size` (None: no bound), with a hit rate on the trace of
    at least `min_hit_rate`, and no other such ladder pads fewer tokens.

    Also guaranteed:
    - every rung is a batch size the trace holds;
    - the top rung is the smallest size of the trace whose steps at or below it are at
      least `min_hit_rate` of all steps (reaching the threshold exactly counts);
    - among ladders with the least padding, one with the fewest rungs;
    - the hit rate is met in whole steps: 7 steps of 100 reach a min_hit_rate of 0.07.
    Errors (ValueError): max_graphs < 1; min_hit_rate outside [0, 1]; an empty trace;
    a top rung above `max_capture_size` (the message names the hit rate asked for and
    the share of steps that is reachable; a top rung equal to the bound is fine).

    Example: trace {1: 5, 2: 9, 3: 2, 5: 7, 6: 1, 9: 4, 12: 6, 15: 1, 20: 1} (36 steps),
    min_hit_rate 0.9: the top rung is 12 (34 of 36 steps). With 1 graph -> [12]; with
    2 graphs -> [5, 12], padding 5*4 + 9*3 + 2*2 + 1*6 + 4*3 = 69 tokens.
    """
    raise NotImplementedError("TODO: step 4")
