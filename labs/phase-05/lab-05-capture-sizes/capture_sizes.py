"""Lab 05 — the capture-size ladder (your code).

Mirrors vLLM's default ladder (`VllmConfig._set_cudagraph_sizes` in vllm/config/vllm.py),
the rung lookup its dispatcher pads with (vllm/v1/cudagraph_dispatcher.py), and the
accounting that says whether a ladder is a good one for a workload.

Each TODO's docstring says what the function must guarantee, with one worked example; it
does not say how. `_as_histogram` and the two report dataclasses are given.

Run: pytest labs/phase-05/lab-05-capture-sizes -m step1   (then step2 ... step5)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


def default_capture_sizes(
    max_num_seqs: int, max_num_batched_tokens: int, enforce_eager: bool = False
) -> list[int]:
    """Step 1: vLLM's default ladder of capture sizes.

    The result:
    - is ascending, holds each size once, and holds no size above
      largest = min(2 * max_num_seqs, 512, max_num_batched_tokens);
    - holds, of the sizes up to largest, exactly these: 1, 2 and 4; every multiple of 8
      below 256; every multiple of 16 from 256 on;
    - is [] with enforce_eager (no graphs at all).
    Errors (ValueError): max_num_seqs < 1 or max_num_batched_tokens < 1.

    Example: (max_num_seqs=8, max_num_batched_tokens=8192) -> [1, 2, 4, 8, 16].
    """
    raise NotImplementedError("TODO: step 1")


def normalize_capture_sizes(sizes: Iterable[int], max_num_batched_tokens: int) -> list[int]:
    """Step 2: a user's ladder as vLLM keeps it: each size once, only sizes <=
    max_num_batched_tokens (a batch never holds more tokens than that), ascending.

    `sizes` may be any iterable, a generator included; a list the caller passed is left
    as it was.
    Errors (ValueError): an empty `sizes`; a size that is not a positive int (a bool
    is not a size); every size above the token budget (nothing would be captured).

    Example: ([64, 8, 8, 1, 4096, 16], max_num_batched_tokens=2048) -> [1, 8, 16, 64].
    """
    raise NotImplementedError("TODO: step 2")


def padded_size(num_tokens: int, capture_sizes: list[int]) -> int | None:
    """Step 3: the rung a batch of `num_tokens` runs on: the smallest size in
    `capture_sizes` (ascending) that is >= num_tokens, or None when the batch is larger
    than every size (it runs eagerly, without a graph; an empty ladder has no rung).
    Errors: num_tokens < 1 -> ValueError.

    Example on the default ladder of max_num_seqs=256: 33 -> 40.
    """
    raise NotImplementedError("TODO: step 3")


@dataclass(frozen=True)
class PaddingReport:
    """What a ladder does to a stream of batches."""

    real_tokens: int  # tokens the batches actually held
    padding_tokens: int  # tokens added to reach a rung (zero for batches that run eagerly)
    graph_steps: int  # batches that landed on a rung and replayed a graph
    eager_steps: int  # batches above the ladder, run without a graph

    @property
    def waste(self) -> float:
        """Padding tokens over real tokens (the share of extra work the graphs cost)."""
        return self.padding_tokens / self.real_tokens if self.real_tokens else 0.0

    @property
    def hit_rate(self) -> float:
        """Share of steps that replayed a graph."""
        steps = self.graph_steps + self.eager_steps
        return self.graph_steps / steps if steps else 0.0


def _as_histogram(batch_sizes: Mapping[int, int] | Iterable[int]) -> Counter:
    """Given: a trace as {batch size: number of steps}, from a list of sizes or a mapping."""
    if isinstance(batch_sizes, Mapping):
        return Counter({int(k): int(v) for k, v in batch_sizes.items()})
    return Counter(int(b) for b in batch_sizes)


def padding_waste(
    batch_sizes: Mapping[int, int] | Iterable[int], capture_sizes: list[int]
) -> PaddingReport:
    """Step 4: what `capture_sizes` does to a trace of batch sizes, one batch a step.

    `batch_sizes` is a list of sizes (one per step) or {size: number of steps}; both
    describe the same trace and give the same report.
    - A step that fits the ladder is a graph step: its tokens are real tokens, and it
      adds (rung - size) padding tokens.
    - A step above the ladder is an eager step: it replays no graph and adds no padding.
      Whether its tokens count in real_tokens is step 4's decision (README).

    Example on the default ladder of max_num_seqs=256: [33, 40, 3] ->
    PaddingReport(real_tokens=76, padding_tokens=8, graph_steps=3, eager_steps=0)
    (33 pads to 40, 40 is a rung, 3 pads to 4).
    """
    raise NotImplementedError("TODO: step 4")


@dataclass(frozen=True)
class LadderCost:
    """Both sides of the trade a denser ladder makes."""

    num_graphs: int
    padding: PaddingReport
    capture_seconds: float
    graph_memory_mib: float


def ladder_cost(
    batch_sizes: Mapping[int, int] | Iterable[int],
    capture_sizes: list[int],
    capture_seconds_per_graph: float,
    memory_mib_per_graph: float,
) -> LadderCost:
    """Step 5: the two sides of a ladder: its padding on the trace against what its
    graphs cost at start-up. The engine captures one graph per size of the ladder,
    whether or not the trace ever uses it; each costs `capture_seconds_per_graph` of
    start-up time and `memory_mib_per_graph` of graph memory.
    Errors: a negative per-graph cost -> ValueError (a cost of zero is allowed).

    Example: ({3: 10}, [1, 2, 4, 8], 0.5, 20.0) ->
    LadderCost(num_graphs=4, padding=PaddingReport(30, 10, 10, 0),
    capture_seconds=2.0, graph_memory_mib=80.0).
    """
    raise NotImplementedError("TODO: step 5")
