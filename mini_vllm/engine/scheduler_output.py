"""What one scheduling step decided: the contract between the scheduler and the model runner.

vLLM counterpart: vllm/v1/core/sched/output.py (`SchedulerOutput`, `NewRequestData`,
`CachedRequestData`). vLLM sends the worker only what changed since the last step,
because the worker keeps its own copy of each request. mini_vllm sends every
scheduled row in full, a snapshot taken at schedule time: the runner can build the
flattened batch from this object alone, and nothing it reads moves under it when
update_from_output() advances the live sequences.

Building one forward from a `SchedulerOutput` (rows in order, tokens of a row contiguous):

    input_ids     = concat(row.new_token_ids)
    positions     = concat(row.positions)           # num_computed_tokens .. context_len - 1
    slot_mapping  = concat(slot_mapping(row.block_table, row.num_computed_tokens,
                                        row.context_len, output.block_size))
    block_tables  = [row.block_table]               # padded to a rectangle by the runner
    context_lens  = [row.context_len]               # keys each row's attention reads
    query_lens    = [row.num_new_tokens]
    sample rows   = the last token of each row with row.samples_token

Padded rows (to reach a captured graph size) get slot PAD_SLOT_ID (-1) and context 0.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from mini_vllm.engine.sequence import Sequence

__all__ = ["ScheduledSequence", "SchedulerOutput"]


# ANCHOR: scheduled_sequence
@dataclass(frozen=True)
class ScheduledSequence:
    """One row of the batch: a request and the tokens it computes this step."""

    seq: Sequence  # the live request (its id and sampling params)
    num_new_tokens: int  # query length of this row
    num_computed_tokens: int  # K/V already cached = position of the first new token
    new_token_ids: tuple[int, ...]  # the tokens fed this step
    block_table: tuple[int, ...]  # covers context_len tokens, allocated for this step
    is_prefill: bool  # still computing prompt (or recompute) tokens
    samples_token: bool  # this step reaches the sequence's last token: sample from it

    @property
    def seq_id(self) -> Hashable:
        return self.seq.seq_id

    @property
    def context_len(self) -> int:
        """Tokens in the cache once this step has written its K/V (attention's seq_len)."""
        return self.num_computed_tokens + self.num_new_tokens

    @property
    def positions(self) -> range:
        return range(self.num_computed_tokens, self.context_len)


# ANCHOR_END: scheduled_sequence


@dataclass(frozen=True)
class SchedulerOutput:
    """The batch of one step, in row order: running requests first, newly admitted after."""

    step: int
    scheduled: tuple[ScheduledSequence, ...]
    block_size: int
    preempted_ids: tuple[Hashable, ...] = ()  # sent back to the waiting queue this step
    failed: tuple[
        Sequence, ...
    ] = ()  # finished with an error since the last step; not in `scheduled`

    @property
    def num_reqs(self) -> int:
        return len(self.scheduled)

    @property
    def total_num_tokens(self) -> int:
        """Tokens in the batch: the length of the flattened input_ids before padding."""
        return sum(row.num_new_tokens for row in self.scheduled)

    @property
    def max_query_len(self) -> int:
        return max((row.num_new_tokens for row in self.scheduled), default=0)

    @property
    def seq_ids(self) -> tuple[Hashable, ...]:
        return tuple(row.seq_id for row in self.scheduled)

    @property
    def num_prefills(self) -> int:
        return sum(1 for row in self.scheduled if row.is_prefill)

    @property
    def num_decodes(self) -> int:
        return len(self.scheduled) - self.num_prefills

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    # ANCHOR: uniform_decode
    @property
    def is_uniform_decode(self) -> bool:
        """Every row decodes exactly one token and none is in prefill: the batches a
        FULL CUDA graph serves (a batch of num_reqs tokens, one query token a row).

        Stricter than vLLM's test in gpu_model_runner, which looks only at query
        lengths: a 1-token prompt, or a prefill's last 1-token chunk, counts as mixed
        here. Erring that way only costs a rare FULL-graph miss, never a wrong replay.
        """
        return bool(self.scheduled) and all(
            row.num_new_tokens == 1 and not row.is_prefill for row in self.scheduled
        )

    # ANCHOR_END: uniform_decode

    def __repr__(self) -> str:
        kind = (
            "uniform decode" if self.is_uniform_decode else ("empty" if self.is_empty else "mixed")
        )
        extra = ""
        if self.preempted_ids:
            extra += f", preempted {list(self.preempted_ids)}"
        if self.failed:
            extra += f", failed {[s.seq_id for s in self.failed]}"
        return (
            f"SchedulerOutput(step {self.step}: {self.num_reqs} reqs ({self.num_prefills} prefill, "
            f"{self.num_decodes} decode), {self.total_num_tokens} tokens, {kind}{extra})"
        )
