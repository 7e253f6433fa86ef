"""Phase 03, lab 01 — continuous batching: the scheduler (your code).

Mirrors mini_vllm/engine/scheduler.py, the course's version of vLLM's
vllm/v1/core/sched/scheduler.py (`Scheduler.schedule`, `_preempt_request`,
`update_from_output`; the stop rules of `check_stop` in vllm/v1/core/sched/utils.py).
Run: pytest labs/phase-03/lab-01-scheduler

The supporting pieces come from mini_vllm and are not what this lab tests: the
request (`Sequence`), the block manager of the Phase 02 lab (`BlockManager`), the limits
(`SchedulerConfig`) and the step's result (`SchedulerOutput`, `ScheduledSequence`).

The policy you implement, one schedule() call:
1. running requests first, in admission order: each gets min(seq.num_new_tokens,
   remaining budget) tokens (1 when decoding, the rest of the prompt or a chunk of it
   when still in prefill); when its blocks do not fit, preempt the most recently
   admitted running request (the last of the running list) until they do — possibly
   the request itself, which ends the loop;
2. then, only if nothing was preempted this step, admit waiting requests first come
   first served while the budget, max_num_seqs and the free blocks allow, reusing
   prefix-cached tokens and chunking a prompt that does not fit the budget (when
   config.enable_chunked_prefill; otherwise the request waits);
3. a request that could never run is finished with FinishReason.ERROR and reported
   in the next output's `failed`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from collections.abc import Sequence as SequenceT

from mini_vllm.engine.block_manager import BlockManager
from mini_vllm.engine.scheduler_config import SchedulerConfig
from mini_vllm.engine.scheduler_output import ScheduledSequence, SchedulerOutput
from mini_vllm.engine.sequence import FinishReason, Sequence, SequenceStatus

__all__ = ["Scheduler", "ScheduledSequence", "SchedulerConfig", "SchedulerOutput"]


class Scheduler:
    """Waiting and running queues over one BlockManager."""

    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: BlockManager,
        eos_token_id: int | None = None,
    ) -> None:
        """Given: the state you work with."""
        self.config = config
        self.block_manager = block_manager
        self.eos_token_id = eos_token_id  # None: only max_tokens / max_model_len stop a request
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []  # admission order: the last one is the next victim
        self._failed: list[Sequence] = []  # failed since the last schedule(), not yet reported
        self._live_ids: set[Hashable] = set()
        self._in_flight: SchedulerOutput | None = None  # the output awaiting update_from_output
        self._step = 0
        self._arrivals = 0
        self.num_preemptions = 0  # over the scheduler's lifetime

    def get_request_counts(self) -> tuple[int, int]:
        """Given: (running, waiting) requests; a request preempted this step is waiting again."""
        return len(self._running), len(self._waiting)

    def has_unfinished_requests(self) -> bool:
        """Given: True while a request waits, runs, or has a failure still to report."""
        return bool(self._waiting or self._running or self._failed)

    def add_request(self, seq: Sequence) -> None:
        """Given: queue a new request at the back of the waiting queue (or fail it)."""
        if seq.status is not SequenceStatus.WAITING or seq.num_computed_tokens or seq.block_table:
            raise ValueError(f"request {seq.seq_id!r} is not new ({seq!r}); add each Sequence once")
        if seq.seq_id in self._live_ids:
            raise ValueError(
                f"request id {seq.seq_id!r} is already in use by an unfinished request"
            )
        seq.arrival = self._arrivals
        self._arrivals += 1
        why = self._why_never_runs(seq)
        if why is not None:
            seq.finish(FinishReason.ERROR, why)
            self._failed.append(seq)
            return
        self._live_ids.add(seq.seq_id)
        self._waiting.append(seq)

    def _why_never_runs(self, seq: Sequence) -> str | None:
        """Why this request could not run even on an empty engine, or None.

        Two reasons: its prompt is longer than config.max_model_len, or its
        seq.num_tokens need more blocks (block_manager.blocks_needed) than the whole
        cache has (block_manager.num_blocks). Say which, with the numbers: the message
        is what the user sees (mention max_model_len, or the blocks needed and had)."""
        raise NotImplementedError("TODO: two checks, each returning a clear message")

    def _row(self, seq: Sequence, num_new_tokens: int) -> ScheduledSequence:
        """Given: the snapshot of one batch row, taken after its blocks are allocated."""
        start = seq.num_computed_tokens
        return ScheduledSequence(
            seq=seq,
            num_new_tokens=num_new_tokens,
            num_computed_tokens=start,
            new_token_ids=tuple(seq.tokens(start, start + num_new_tokens)),
            block_table=tuple(seq.block_table),
            is_prefill=seq.is_prefill,
            samples_token=start + num_new_tokens == seq.num_tokens,
        )

    def schedule(self) -> SchedulerOutput:
        """Decide this step's batch (the policy is in the module docstring).

        Refuse (RuntimeError) while the previous output is still in flight. Build the
        rows with self._row(seq, n) after the blocks for them are allocated
        (block_manager.append_slots for running requests; block_manager.allocate for
        admitted ones, then set seq.num_computed_tokens to the cached tokens, the
        status to RUNNING and append it to self._running). Return
        SchedulerOutput(step=self._step, scheduled=rows, block_size=...,
        preempted_ids=ids of requests sent back to waiting, failed=requests that
        failed since the last step), remembering it in self._in_flight.
        """
        raise NotImplementedError("TODO: running requests, then waiting requests")

    def _preempt(self, seq: Sequence) -> None:
        """Preemption by recompute. The caller has removed seq from self._running.
        Free its blocks and set num_computed_tokens to 0 (its tokens stay); if it has
        outgrown the whole cache (_why_never_runs), finish it with ERROR instead (and
        drop its id from self._live_ids).
        Otherwise set it WAITING, count the preemption (seq.num_preemptions and
        self.num_preemptions) and put it at the FRONT of the waiting queue."""
        raise NotImplementedError("TODO")

    def update_from_output(
        self, output: SchedulerOutput, sampled_token_ids: SequenceT[int | None]
    ) -> list[Sequence]:
        """Apply one step's result and return the requests that finished (the
        output's `failed` ones included).

        `output` must be the one in flight (else RuntimeError) and
        `sampled_token_ids` must have one entry per row (else ValueError). For each row:
        advance num_computed_tokens, call block_manager.cache_full_blocks(seq), and if
        row.samples_token append the token and check the stop rules in this order: EOS
        (unless sampling_params.ignore_eos) -> STOP; max_tokens output tokens -> LENGTH;
        num_tokens >= max_model_len -> LENGTH. A finished request gives its blocks back,
        leaves the running list and self._live_ids, and is finished with its reason.
        """
        raise NotImplementedError("TODO")
