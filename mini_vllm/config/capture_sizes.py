"""The capture-size ladder: which batch sizes get a graph, and what padding costs.

vLLM counterpart: vllm/config/vllm.py (`VllmConfig._set_cudagraph_sizes`, the
default ladder) and the padding lookup of vllm/v1/cudagraph_dispatcher.py. The
accounting helpers (padding waste, ladder cost) are the course's own: they answer
"why is my batch of 33 running at 40?" and "how many graphs are worth capturing?".

`default_capture_sizes` and `normalize_capture_sizes` follow an earlier, simpler vLLM
ladder: 1, 2, 4, every 8 below 256, every 16 from 256, up to
min(2 * max_num_seqs, 512, max_num_batched_tokens); a user's list de-duplicated, cut at
max_num_batched_tokens and sorted. vLLM at the pinned commit 9aaf83e
(`_set_cudagraph_sizes`) adds four rules that mini_vllm leaves out:
https://github.com/vllm-project/vllm/blob/9aaf83ef502fc37bc647f6e474314d48ba36cd1c/vllm/config/vllm.py#L1584-L1754

- the default largest size is min(2 * max_num_seqs * q, 512), q = 1 +
  num_speculative_tokens being a decode request's query length (lines 1637-1646);
- max_num_batched_tokens becomes a rung of the default ladder when it is at most the
  largest size and not one already, so the largest batch the scheduler can form has a
  graph (lines 1688-1693);
- with performance_mode="interactivity" the default ladder starts with every size from
  1 to min(largest, 32) instead of 1, 2, 4 (lines 1669-1673);
- under sequence parallelism only multiples of the tensor-parallel size are kept
  (lines 1697-1703).

Later, when decode runs in FULL graphs and q > 1, every size is rounded up to a
multiple of q and sizes past the largest are dropped
(`CompilationConfig.adjust_cudagraph_sizes_for_spec_decode`):
https://github.com/vllm-project/vllm/blob/9aaf83ef502fc37bc647f6e474314d48ba36cd1c/vllm/config/compilation.py#L1464-L1509
`padded_size` bisects the ladder where vLLM's dispatcher reads a table precomputed for
every token count; the rung is the same.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mini_vllm.errors import UserError

__all__ = [
    "LadderCost",
    "PaddingReport",
    "default_capture_sizes",
    "ladder_cost",
    "normalize_capture_sizes",
    "padded_size",
    "padding_waste",
]


# ANCHOR: default_capture_sizes
def default_capture_sizes(
    max_num_seqs: int, max_num_batched_tokens: int, enforce_eager: bool = False
) -> list[int]:
    """vLLM's default ladder: 1, 2, 4, then every 8 up to 248, then every 16 up to 512."""
    if max_num_seqs < 1 or max_num_batched_tokens < 1:
        raise UserError(
            "max_num_seqs and max_num_batched_tokens must be >= "
            f"1, got {max_num_seqs} and {max_num_batched_tokens}"
        )
    if enforce_eager:
        return []  # no graphs at all: nothing to capture
    largest = min(max_num_seqs * 2, 512, max_num_batched_tokens)
    sizes = [s for s in (1, 2, 4) if s <= largest]
    sizes += list(range(8, min(largest + 1, 256), 8))
    sizes += list(range(256, largest + 1, 16))
    return sizes


# ANCHOR_END: default_capture_sizes


def normalize_capture_sizes(sizes: Iterable[int], max_num_batched_tokens: int) -> list[int]:
    """A user's ladder as vLLM keeps it: de-duplicated, within the token budget, ascending."""
    sizes = list(sizes)
    if not sizes:
        raise UserError(
            "capture sizes must not be empty; pass enforce_eager=True to capture nothing"
        )
    bad = [s for s in sizes if not isinstance(s, int) or isinstance(s, bool) or s < 1]
    if bad:
        raise UserError(f"capture sizes must be positive integers, got {bad}")
    kept = sorted({s for s in sizes if s <= max_num_batched_tokens})
    if not kept:
        raise UserError(
            f"every capture size in {sorted(set(sizes))} is above "
            f"max_num_batched_tokens={max_num_batched_tokens}; nothing would be captured"
        )
    return kept


# ANCHOR: padded_size
def padded_size(num_tokens: int, capture_sizes: list[int]) -> int | None:
    """The rung a batch runs on: the smallest capture
    size >= num_tokens, or None above the ladder."""
    if num_tokens < 1:
        raise UserError(f"a batch has at least one token, got {num_tokens}")
    index = bisect.bisect_left(capture_sizes, num_tokens)
    return capture_sizes[index] if index < len(capture_sizes) else None


# ANCHOR_END: padded_size


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
    if isinstance(batch_sizes, Mapping):
        return Counter({int(k): int(v) for k, v in batch_sizes.items()})
    return Counter(int(b) for b in batch_sizes)


# ANCHOR: padding_waste
def padding_waste(
    batch_sizes: Mapping[int, int] | Iterable[int], capture_sizes: list[int]
) -> PaddingReport:
    """Replay a batch-size trace (a list of sizes, or {size: count}) against a ladder."""
    real = padding = hits = misses = 0
    for size, count in _as_histogram(batch_sizes).items():
        rung = padded_size(size, capture_sizes)
        real += size * count
        if rung is None:
            misses += count
        else:
            hits += count
            padding += (rung - size) * count
    return PaddingReport(
        real_tokens=real, padding_tokens=padding, graph_steps=hits, eager_steps=misses
    )


# ANCHOR_END: padding_waste


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
    """Padding waste against start-up time and memory: more rungs, less waste, more graphs."""
    if capture_seconds_per_graph < 0 or memory_mib_per_graph < 0:
        raise UserError("per-graph capture time and memory must be >= 0")
    n = len(capture_sizes)
    return LadderCost(
        num_graphs=n,
        padding=padding_waste(batch_sizes, capture_sizes),
        capture_seconds=n * capture_seconds_per_graph,
        graph_memory_mib=n * memory_mib_per_graph,
    )
