"""Phase 03, lab 01 — continuous batching: the scheduler (your code).

Modelled on vLLM's vllm/v1/core/sched/scheduler.py (`Scheduler.schedule`,
`_preempt_request`, `update_from_output`; the stop rules of `check_stop` in
vllm/v1/core/sched/utils.py).
Run: pytest labs/phase-03/lab-01-scheduler (one step: add -m step1, -m step2, ...)

Given, from mini_vllm, and not what this lab tests: the request (`Sequence`), the block
manager of the Phase 02 lab (`BlockManager`), the limits (`SchedulerConfig`) and the
step's result (`SchedulerOutput`, `ScheduledSequence`). Given here: the queues and
counters (`__init__`), `add_request`, `_row` and `_fail`.

The policy, one schedule() call (vLLM V1's, first come first served):
- running requests first, in admission order: each computes what it lacks
  (`seq.num_new_tokens`: 1 when decoding, the rest of its prompt when not), cut to the
  token budget that is left; when its blocks do not fit, the most recently admitted
  running request is preempted (possibly the request itself);
- then waiting requests in arrival order while the budget, max_num_seqs and the free
  blocks allow (what a step that had to preempt may admit is step 5's decision); a
  prompt longer than the budget left is chunked when config.enable_chunked_prefill, and
  waits otherwise;
- a request that could never run fails with FinishReason.ERROR and is reported in the
  next output's `failed`; the others carry on.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable
from collections.abc import Sequence as SequenceT

from mini_vllm.engine.block_manager import BlockManager
from mini_vllm.engine.scheduler_config import SchedulerConfig
from mini_vllm.engine.scheduler_output import ScheduledSequence, SchedulerOutput
from mini_vllm.engine.sequence import FinishReason, Sequence, SequenceStatus
from mini_vllm.errors import UserError

__all__ = ["Scheduler", "ScheduledSequence", "SchedulerConfig", "SchedulerOutput"]


class Scheduler:
    """Waiting and running queues over one BlockManager."""

    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: BlockManager,
        eos_token_id: int | Iterable[int] | None = None,
    ) -> None:
        """Given: the state you work with.

        self._waiting    deque of WAITING requests, the next to admit at the left;
        self._running    list of RUNNING requests in admission order (the last one is the
                         next to preempt);
        self._failed     requests that failed since the last schedule(), to report;
        self._requests   every unfinished request, by id;
        self._in_flight  outputs scheduled and not yet updated (at most
                         self.max_steps_in_flight of them, here 1);
        self._step       number of the next step; self.num_preemptions, a lifetime count.
        """
        self.config = config
        self.block_manager = block_manager
        # None: only max_tokens / max_model_len stop a request. Llama 3 checkpoints
        # have several end tokens, so keep a set.
        if eos_token_id is None:
            self.eos_token_ids: frozenset[int] = frozenset()
        elif isinstance(eos_token_id, int):
            self.eos_token_ids = frozenset({eos_token_id})
        else:
            self.eos_token_ids = frozenset(int(t) for t in eos_token_id)
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []  # admission order: the last one is the next victim
        self._failed: list[Sequence] = []  # failed since the last schedule(), not yet reported
        self._requests: dict[Hashable, Sequence] = {}  # every unfinished request, by id
        # Steps scheduled but not yet updated, oldest first: at most one here; the
        # async scheduler (mini_vllm/engine/async_scheduler.py) allows two.
        self._in_flight: deque[SchedulerOutput] = deque()
        self.max_steps_in_flight = 1
        self._step = 0
        self._arrivals = 0
        self.num_preemptions = 0  # over the scheduler's lifetime

    # -- queues -------------------------------------------------------------------

    def get_request_counts(self) -> tuple[int, int]:
        """Given: (running, waiting) requests; a request preempted this step is waiting again."""
        return len(self._running), len(self._waiting)

    def has_unfinished_requests(self) -> bool:
        """Given: True while a request waits, runs, or has a failure still to report."""
        return bool(self._waiting or self._running or self._failed)

    def add_request(self, seq: Sequence) -> None:
        """Given: queue a new request at the back of the waiting queue (or fail it at once)."""
        if seq.status is not SequenceStatus.WAITING or seq.num_computed_tokens or seq.block_table:
            raise UserError(f"request {seq.seq_id!r} is not new ({seq!r}); add each Sequence once")
        if seq.seq_id in self._requests:
            raise UserError(f"request id {seq.seq_id!r} is already in use by an unfinished request")
        seq.arrival = self._arrivals
        self._arrivals += 1
        why = self._why_never_runs(seq)
        if why is not None:
            seq.finish(FinishReason.ERROR, why)
            self._failed.append(seq)
            return
        self._requests[seq.seq_id] = seq
        self._waiting.append(seq)

    # -- step 1 -------------------------------------------------------------------

    def _why_never_runs(self, seq: Sequence) -> str | None:
        """Why this request could not run even on an empty engine, or None if it could.

        It could not when its prompt leaves no room under config.max_model_len for one
        output token (prompt + output never pass max_model_len, vLLM's rule), or when its
        seq.num_tokens tokens need more KV blocks than the whole cache has
        (block_manager.num_blocks; a partly filled block is a whole block).

        The message is what the user reads: it names the limit broken and the numbers.
        A prompt too long mentions `max_model_len`; a request too big for the cache
        mentions `block`s, how many it needs and how many the cache has.

        Example, max_model_len=16, 4 blocks of 4 tokens: a 17-token prompt gives a message
        with "max_model_len", 17 and 16. With max_model_len=128 the same prompt needs 5
        blocks: a message with "block", 5 and 4.
        """
        raise NotImplementedError("TODO: step 1")

    # -- step 2 -------------------------------------------------------------------

    def _row(self, seq: Sequence, num_new_tokens: int) -> ScheduledSequence:
        """Given: the snapshot of one batch row; take it once the row's blocks exist."""
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
        """Decide this step's batch, following the policy in the module docstring.

        Raises RuntimeError while a step is in flight (self.max_steps_in_flight of them
        scheduled and not yet passed to update_from_output).

        Returns SchedulerOutput(step=self._step, scheduled=rows, block_size=the cache's,
        preempted_ids=..., failed=...), also appended to self._in_flight, where:
        - rows are the running requests' rows in admission order, then the rows of
          the requests admitted this step, in arrival order; each row is self._row(seq, n)
          taken after seq holds the blocks for its n new tokens (block_manager's
          can_append/append_slots for a running request, can_allocate/allocate for a
          waiting one);
        - the rows' tokens add up to at most config.max_num_batched_tokens, and
          self._running never holds more than config.max_num_seqs requests;
        - a running request short of blocks gets them from self._make_room (step 4);
        - waiting requests are admitted first come first served: when the head of the
          queue cannot go (budget, blocks, or a whole prompt that does not fit without
          chunking), nobody behind it goes. An admitted request counts its prefix-cached
          tokens (block_manager.num_cached_tokens) as computed, is RUNNING and is last
          in self._running;
        - preempted_ids: the requests preempted this step that wait again, in order;
          failed: the requests of self._failed (which is emptied), then those that
          failed while being preempted.

        Example: max_num_batched_tokens=10, max_num_seqs=4, chunked prefill on, four
        4-token prompts a, b, c, d on a fresh scheduler: rows (id, computed, new) are
        (a, 0, 4), (b, 0, 4), (c, 0, 2), and only a's and b's rows sample a token;
        get_request_counts() is then (3, 1). Once updated, the next step is
        (a, 4, 1), (b, 4, 1), (c, 2, 2), (d, 0, 4): 8 tokens.
        """
        raise NotImplementedError("TODO: step 2 (admission), step 4 (running requests)")

    # -- step 3 -------------------------------------------------------------------

    def update_from_output(
        self, output: SchedulerOutput, sampled_token_ids: SequenceT[int | None]
    ) -> list[Sequence]:
        """Apply one step's result; return the requests that finished, in this order:
        output.failed, then the rows' requests that stopped this step, in row order.

        `output` must be the step in flight (self._in_flight[0]), else RuntimeError;
        `sampled_token_ids` holds one entry per row, else ValueError, and nothing changes.
        The step then leaves self._in_flight and self._step grows by one.

        For every row, the request's num_computed_tokens grows by row.num_new_tokens
        and block_manager.cache_full_blocks(seq) is told (prefix caching shares the
        blocks it completed). A row with samples_token appends its token; any other row's
        entry is ignored, whatever it holds. After the append the request stops:
        STOP on an EOS (any id in self.eos_token_ids) unless sampling_params.ignore_eos;
        else LENGTH once it has sampling_params.max_tokens output tokens, or once
        prompt + output reach config.max_model_len. EOS wins when both apply. A stopped
        request gives its blocks back, leaves self._running and self._requests, and is
        finished with seq.finish(reason).

        Example: a 4-token prompt with max_tokens=1, scheduled whole: update with [7]
        returns [that request], its output is (7,), finish_reason LENGTH, no blocks
        held. With [EOS] instead it is STOP. With max_tokens=2, [7] returns [] and the
        request decodes next (num_computed_tokens 4, num_new_tokens 1).
        """
        raise NotImplementedError("TODO: step 3")

    # -- step 4 -------------------------------------------------------------------

    def _make_room(self, seq: Sequence, num_new_tokens: int, preempted: list[Sequence]) -> bool:
        """Make sure running request `seq` can get blocks for its next num_new_tokens
        tokens. True when it can (block_manager.can_append(seq, num_new_tokens) holds);
        False when seq itself had to be preempted.

        Room comes only from preempting running requests, most recently admitted first
        (the end of self._running), each one through self._preempt (step 5), removed
        from self._running and appended to `preempted`, and no more of them than needed.
        Preempting seq itself ends it: it is the last entry of `preempted` and the
        answer is False.

        Example: running [a, b, c], no free block, a needs one: c (holding 1 block) is
        preempted, the answer is True, preempted == [c], running [a, b]. If instead c
        itself needs a block, c is preempted and the answer is False.
        """
        raise NotImplementedError("TODO: step 4")

    # -- step 5 -------------------------------------------------------------------

    def _preempt(self, seq: Sequence) -> None:
        """Preemption by recompute, of a request the caller has just removed from
        self._running.

        Afterwards seq holds no blocks and num_computed_tokens == 0, and its tokens
        (prompt and generated) are unchanged, so its next admission recomputes them all
        and carries on where it stopped. It is WAITING at the FRONT of self._waiting
        (it arrived before everyone there), and seq.num_preemptions and
        self.num_preemptions are one higher.
        Unless it has outgrown the whole cache (_why_never_runs gives a reason): then
        it is finished with FinishReason.ERROR and that message, in no queue and out of
        self._requests (self._fail does exactly that), and is not counted as preempted.

        Example: running [a, b], waiting [c]; b holds 2 blocks with 6 tokens computed.
        After _preempt(b): waiting [b, c], 2 more free blocks, b.num_computed_tokens == 0,
        b.num_tokens unchanged, b.num_preemptions == 1.
        """
        raise NotImplementedError("TODO: step 5")

    def _fail(self, seq: Sequence, why: str) -> None:
        """Given: finish with an error a request that holds no blocks and sits in no queue."""
        self._requests.pop(seq.seq_id, None)
        seq.finish(FinishReason.ERROR, why)
