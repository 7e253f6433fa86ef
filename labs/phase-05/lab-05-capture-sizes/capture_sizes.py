"""Lab 05 — the capture-size ladder (your code).

Mirrors mini_vllm/config/capture_sizes.py: vLLM's default ladder
(vllm/config/vllm.py, `VllmConfig._set_cudagraph_sizes`), the rung lookup the
dispatcher pads with, and the accounting that tells you whether a ladder is good.
Run: pytest labs/phase-05/lab-05-capture-sizes
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


def default_capture_sizes(
    max_num_seqs: int, max_num_batched_tokens: int, enforce_eager: bool = False
) -> list[int]:
    """vLLM's default ladder, ascending.

    largest = min(2 * max_num_seqs, 512, max_num_batched_tokens); the ladder is
    [1, 2, 4] (those <= largest) + every 8 from 8 while below 256 and <= largest +
    every 16 from 256 up to largest. With enforce_eager there are no graphs: [].
    Non-positive limits are a ValueError.
    """
    raise NotImplementedError("TODO: three ranges glued together")


def normalize_capture_sizes(sizes: Iterable[int], max_num_batched_tokens: int) -> list[int]:
    """A user's ladder as vLLM keeps it: de-duplicated, <= the token budget, ascending.
    Empty input, or a size that is not a positive int, is a ValueError."""
    raise NotImplementedError("TODO")


def padded_size(num_tokens: int, capture_sizes: list[int]) -> int | None:
    """The rung a batch runs on: the smallest capture size >= num_tokens
    (33 -> 40 on the default ladder), or None above the largest (the batch runs eagerly).
    Hint: the standard library's bisect module does the search."""
    raise NotImplementedError("TODO")


@dataclass(frozen=True)
class PaddingReport:
    """Given: what a ladder does to a stream of batches."""

    real_tokens: int  # tokens the batches actually held
    padding_tokens: int  # tokens added to reach a rung (0 for batches run eagerly)
    graph_steps: int  # batches that landed on a rung
    eager_steps: int  # batches above the ladder

    @property
    def waste(self) -> float:
        return self.padding_tokens / self.real_tokens if self.real_tokens else 0.0

    @property
    def hit_rate(self) -> float:
        steps = self.graph_steps + self.eager_steps
        return self.graph_steps / steps if steps else 0.0


def padding_waste(
    batch_sizes: Mapping[int, int] | Iterable[int], capture_sizes: list[int]
) -> PaddingReport:
    """Run a trace of batch sizes (a list, or {size: count}) against a ladder."""
    histogram = (  # noqa: F841  (given: the trace as {batch size: count}, for your loop)
        Counter(dict(batch_sizes)) if isinstance(batch_sizes, Mapping) else Counter(batch_sizes)
    )
    raise NotImplementedError("TODO: sum real tokens, padding and hits over the histogram")


@dataclass(frozen=True)
class LadderCost:
    """Given: both sides of the trade a denser ladder makes."""

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
    """Padding waste against start-up time and graph memory (one graph per rung).
    Negative per-graph costs are a ValueError."""
    raise NotImplementedError("TODO")
