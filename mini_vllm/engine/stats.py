"""What the engine did, step by step, and the numbers production engineers watch.

vLLM counterpart: vllm/v1/metrics/stats.py (`SchedulerStats`, `IterationStats`) and
the CUDA-graph accounting of vllm/compilation/cuda_graph.py (`CUDAGraphStat`:
unpadded tokens, padded tokens, runtime mode per step). The graph metrics follow the
course's production chapter: `decode_graph_hit_rate` is the share of decode steps
that replayed a graph, `padding_waste` the padded tokens over the real ones.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

__all__ = ["EngineStats", "StepRecord"]


# ANCHOR: step_record
@dataclass(frozen=True)
class StepRecord:
    """One forward of the model runner."""

    num_reqs: int  # rows in the batch (before padding)
    num_tokens: int  # real tokens
    num_padded_tokens: int  # tokens after padding to a captured size (== num_tokens when eager)
    num_prefill_tokens: int
    num_decode_tokens: int
    uniform_decode: bool  # every row decodes one token
    runtime_mode: str  # "NONE", "PIECEWISE" or "FULL"
    seconds: float  # wall time of input preparation, the forward and sampling
    forward_seconds: float = (
        0.0  # the forward alone, device-synchronised (only when the runner times it)
    )


# ANCHOR_END: step_record


@dataclass
class EngineStats:
    """Every step's record, and running counts kept up to date as each step is recorded
    (what a dashboard reads without walking the records)."""

    steps: list[StepRecord] = field(default_factory=list)
    num_preemptions: int = 0
    num_failed_requests: int = 0  # finished with finish_reason "error"
    num_aborted_requests: int = 0  # ended by LLMEngine.abort_request
    num_steps_taken_back: int = 0  # steps that raised and were undone (LLMEngine.step)
    num_steps: int = 0  # steps that ran a forward
    prefill_tokens: int = 0  # prompt tokens computed (a preempted request's are counted again)
    decode_tokens: int = 0
    steps_per_runtime_mode: Counter = field(
        default_factory=Counter
    )  # {"NONE" / "PIECEWISE" / "FULL": steps}
    # ANCHOR: batch_size_histograms
    batch_size_histogram: Counter = field(
        default_factory=Counter
    )  # {rows in the batch: steps}, every step
    # {rows: steps} over uniform-decode steps only: the trace a capture ladder is chosen from
    decode_batch_size_histogram: Counter = field(default_factory=Counter)
    # The graph metrics' running sums, so that a dashboard reads them in O(1).
    num_decode_steps: int = 0  # uniform-decode steps
    num_decode_steps_replayed: int = 0  # of those, the ones that replayed a graph
    num_real_tokens: int = 0
    num_padded_tokens: int = 0  # tokens after padding (== real tokens when eager)
    # False: count each step without keeping its record (a long-running server, whose
    # records would grow without end: mini_vllm/engine/core.py turns it off).
    keep_step_records: bool = True

    def record(self, step: StepRecord) -> None:
        if self.keep_step_records:
            self.steps.append(step)
        self._count(step)

    def _count(self, step: StepRecord) -> None:
        self.num_steps += 1
        self.prefill_tokens += step.num_prefill_tokens
        self.decode_tokens += step.num_decode_tokens
        self.steps_per_runtime_mode[step.runtime_mode] += 1
        self.batch_size_histogram[step.num_reqs] += 1
        if step.uniform_decode:
            self.decode_batch_size_histogram[step.num_reqs] += 1
        self.num_decode_steps += step.uniform_decode
        self.num_decode_steps_replayed += step.uniform_decode and step.runtime_mode != "NONE"
        self.num_real_tokens += step.num_tokens
        self.num_padded_tokens += step.num_padded_tokens

    # ANCHOR_END: batch_size_histograms

    def __post_init__(self) -> None:
        for step in self.steps:  # stats made from recorded steps count them too
            self._count(step)

    def counts(self) -> EngineStats:
        """The running counts alone (no step records, no histograms): what a server sends its
        dashboard after each step, cheap to copy."""
        return replace(
            self,
            steps=[],
            steps_per_runtime_mode=Counter(self.steps_per_runtime_mode),
            batch_size_histogram=Counter(),
            decode_batch_size_histogram=Counter(),
        )

    @property
    def decode_graph_hit_rate(self) -> float:
        """Share of uniform-decode steps that replayed a graph (FULL or PIECEWISE)."""
        if not self.num_decode_steps:
            return 0.0
        return self.num_decode_steps_replayed / self.num_decode_steps

    @property
    def padding_waste(self) -> float:
        """Padded tokens over real tokens, over every step (eager steps add no padding)."""
        real, padded = self.num_real_tokens, self.num_padded_tokens - self.num_real_tokens
        return padded / real if real else 0.0

    def format(self) -> str:
        """A few lines for a terminal."""
        hist = ", ".join(f"{k}:{v}" for k, v in sorted(self.batch_size_histogram.items()))
        modes = ", ".join(f"{k} {v}" for k, v in sorted(self.steps_per_runtime_mode.items()))
        return (
            f"steps {self.num_steps} ({modes}); prefill tokens {self.prefill_tokens}, "
            f"decode tokens {self.decode_tokens}; preemptions "
            f"{self.num_preemptions}\nbatch sizes {{{hist}}}\ndecode graph hit rate "
            f"{self.decode_graph_hit_rate:.1%}, padding waste {self.padding_waste:.1%}"
        )
