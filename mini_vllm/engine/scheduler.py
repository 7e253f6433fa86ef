"""Continuous batching: which requests compute which tokens at each step.

vLLM counterpart: vllm/v1/core/sched/scheduler.py (`Scheduler.schedule`,
`_preempt_request`, `update_from_output`; stop rules from `check_stop` in
vllm/v1/core/sched/utils.py). nano-vllm's nanovllm/engine/scheduler.py is simpler:
a step there is all-prefill or all-decode, never both.

The policy of one `schedule()` call (vLLM V1's, first come first served):

1. Running requests first, in admission order. Each gets what it still lacks,
   `num_new_tokens`, cut to the remaining token budget: 1 token for a decoding
   request, the rest of its prompt (or a chunk of it) for one still in prefill.
2. If its next tokens need a block and none is free, the most recently admitted
   running request is preempted (blocks freed, `num_computed_tokens` reset to 0,
   generated tokens kept, back to the *front* of the waiting queue) until the block
   fits; when the request itself is the most recent, it preempts itself.
3. Then, only if nothing was preempted this step, waiting requests are admitted in
   order while the budget, `max_num_seqs` and the free blocks allow; prefix-cached
   leading blocks are shared instead of computed, those this very step fills for a
   request scheduled before it included (see "Prefix caching" below). A prompt that
   does not fit in the remaining budget is chunked (`enable_chunked_prefill`, on by
   default): it takes what is left, and its next chunk comes as a running request in
   later steps.
   Without chunking it waits for a step with room.
4. A request that can never run — a prompt of `max_model_len` tokens or more, or more
   tokens than the whole KV cache holds — is finished with FinishReason.ERROR and
   reported in the next output's `failed`; the other requests carry on.

Prefix caching: the blocks a prefill row fills are registered when its step is
scheduled, not after it has run (vLLM: `KVCacheManager.allocate_slots`, which calls
`cache_blocks` with the tokens computed once the step has run, capped at the
request's known tokens). So the `n` children of one prompt, or any requests with a
shared prefix, admitted in the same step compute the prefix once: the later ones read
blocks the same forward writes, which is sound because every layer's attention writes
the whole step's K/V into the cache before any request reads it
(mini_vllm/attention/paged.py). Such blocks hold their K/V only once the step has run:
`update_from_output` says it has, and `take_back_steps` evicts them from the prefix
cache when it never will.

So a step mixes decodes and prefill chunks freely ("mixed" batches). The batches
where every scheduled request decodes exactly one token and none is in prefill are
*uniform decode*: `SchedulerOutput.is_uniform_decode` is True for them, and only
they may replay the uniform-decode FULL CUDA graphs of FULL_AND_PIECEWISE or
FULL_DECODE_ONLY (Phase 05, mini_vllm/engine/cudagraph_dispatcher.py); mixed batches go to
PIECEWISE graphs or run eagerly.

`update_from_output(output, sampled_token_ids)` then advances `num_computed_tokens`
by what each row computed, appends the sampled token of the rows whose step reached
the end of the sequence (a prefill chunk that did not reach it samples nothing),
and finishes requests on EOS (unless `ignore_eos`), `max_tokens` or `max_model_len`,
freeing their blocks. Every `schedule()` must be followed by its `update_from_output()`
(the async scheduler, mini_vllm/engine/async_scheduler.py, plans one step further ahead).

Two ways out besides finishing (vLLM: `Scheduler.finish_requests`):
- `finish_requests(ids)` aborts requests (FinishReason.ABORT): they leave the queues
  and give their blocks back at once, even with a step of theirs in flight (its row is
  ignored when its tokens arrive);
- `take_back_steps()` undoes every step scheduled and not yet updated, for when the
  forward, the sampler or the update raised. Every unfinished request gives back its
  blocks and waits to be recomputed from its tokens, as after a preemption, so the
  scheduler is consistent whatever point the exception left it at, and the blocks
  those steps were to fill leave the prefix cache. vLLM has no counterpart: an
  exception in its engine core process ends the engine.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable
from collections.abc import Sequence as SequenceT

from mini_vllm.engine.block_manager import BlockManager
from mini_vllm.engine.scheduler_config import SchedulerConfig
from mini_vllm.engine.scheduler_output import ScheduledSequence, SchedulerOutput
from mini_vllm.engine.sequence import (
    FinishReason,
    Sequence,
    SequenceStatus,
    as_token_id,
    check_stop,
)
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
        """(running, waiting) requests; a request preempted this step is waiting again."""
        return len(self._running), len(self._waiting)

    def has_unfinished_requests(self) -> bool:
        """True while a request waits, runs, or has a failure still to report."""
        return bool(self._waiting or self._running or self._failed)

    def add_request(self, seq: Sequence) -> None:
        """Queue a new request at the back of the waiting queue."""
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

    # ANCHOR: finish_requests
    def finish_requests(
        self, request_ids: Iterable[Hashable], reason: FinishReason = FinishReason.ABORT
    ) -> list[Sequence]:
        """End unfinished requests now (abort, by default) and free their blocks.

        Ids that are unknown or already finished are skipped, so aborting twice is
        harmless. A row of an aborted request in a step still in flight is ignored when
        that step's tokens arrive; the device still writes its K/V into the freed
        blocks, before any later step reads them (one stream runs steps in order). So
        the blocks that step fills stay in the prefix cache: they are right once it
        has run, and `take_back_steps` evicts them if it never does.
        Returns the requests this call finished.
        """
        finished = []
        for request_id in request_ids:
            seq = self._requests.pop(request_id, None)
            if seq is None:
                continue
            if seq.status is SequenceStatus.WAITING:
                self._waiting.remove(seq)
            else:
                self._running.remove(seq)
            self.block_manager.free(seq)
            seq.finish(reason)
            finished.append(seq)
        return finished

    # ANCHOR_END: finish_requests

    # ANCHOR: take_back_steps
    def take_back_steps(self) -> list[Sequence]:
        """Undo every step scheduled and not yet updated (the forward or the update raised).

        Whatever point the exception stopped at, even half-way through schedule() or
        update_from_output(), every unfinished request gives back its blocks, drops the
        placeholders of tokens that will never arrive and waits, in arrival order, to be
        recomputed from the tokens it has. Requests finished since the last output are
        reported again in the next one. Returns the requests sent back to wait.
        """
        for output in self._in_flight:
            self._failed.extend(s for s in output.failed if s not in self._failed)
        unwritten = self._blocks_in_flight()
        self._in_flight.clear()
        requests = sorted(self._requests.values(), key=lambda s: s.arrival)
        for seq in requests:
            self.block_manager.free(seq)
            seq.drop_placeholders()
            seq.num_computed_tokens = 0
            seq.status = SequenceStatus.WAITING
        # Registered when their step was scheduled, written by no step that completed.
        self.block_manager.evict_blocks(unwritten)
        # With nobody holding blocks, any block still counted as held was taken by an
        # allocation the exception cut short and recorded in no table.
        self.block_manager.reclaim_unheld_blocks()
        self._running = []
        self._waiting = deque(requests)
        return requests

    # ANCHOR_END: take_back_steps

    def _blocks_in_flight(self) -> set[int]:
        """Every block that a step not yet updated writes into: the only blocks that can
        be registered for prefix caching (`_cache_blocks_ahead`) before their K/V exists.

        The rows of the steps in flight, aborted and preempted requests' rows included
        (their tables are snapshots); and the blocks past each live request's computed
        tokens, for a `schedule()` cut short before it returned its rows."""
        block_size = self.block_manager.block_size
        blocks: set[int] = set()
        for output in self._in_flight:
            for row in output.scheduled:
                blocks.update(row.block_table[row.num_computed_tokens // block_size :])
        for seq in self._requests.values():
            blocks.update(seq.block_table[seq.num_computed_tokens // block_size :])
        return blocks

    # ANCHOR: why_never_runs
    def _why_never_runs(self, seq: Sequence) -> str | None:
        """Why this request could not be computed even on an empty engine, or None."""
        if seq.num_prompt_tokens >= self.config.max_model_len:  # no room for an output token
            return (
                f"request {seq.seq_id!r}: the prompt has {seq.num_prompt_tokens} "
                f"tokens, and max_model_len={self.config.max_model_len} holds the prompt "
                "and at least one output token; shorten the prompt"
            )
        needed = self.block_manager.blocks_needed(seq.num_tokens)
        if needed > self.block_manager.num_blocks:
            return (
                f"request {seq.seq_id!r}: its {seq.num_tokens} tokens need "
                f"{needed} KV blocks of {self.block_manager.block_size} "
                f"tokens, but the whole cache has {self.block_manager.num_blocks}; "
                "give the cache more blocks or shorten the request"
            )
        return None

    # ANCHOR_END: why_never_runs

    # -- one step -----------------------------------------------------------------

    def _row(self, seq: Sequence, num_new_tokens: int) -> ScheduledSequence:
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
        """Decide this step's batch (see the module docstring for the policy)."""
        if len(self._in_flight) >= self.max_steps_in_flight:
            raise RuntimeError(
                f"step {self._in_flight[0].step} is still in flight: call "
                "update_from_output() with its sampled tokens before scheduling the next step"
            )
        budget = self.config.max_num_batched_tokens
        rows: list[ScheduledSequence] = []
        preempted: list[Sequence] = []

        # ANCHOR: schedule_running
        # 1. Running requests, oldest admission first.
        index = 0
        while index < len(self._running) and budget > 0:
            seq = self._running[index]
            if not self._may_schedule(seq):
                index += 1
                continue
            num_new = min(seq.num_new_tokens, budget)
            if not self._make_room(seq, num_new, preempted):
                break  # seq preempted itself: nobody after it is left running
            self.block_manager.append_slots(seq, num_new)
            self._cache_blocks_ahead(seq, num_new)
            rows.append(self._row(seq, num_new))
            budget -= num_new
            index += 1
        # ANCHOR_END: schedule_running

        # ANCHOR: schedule_waiting
        # 2. Waiting requests, first come first served. Not after a preemption: the
        #    cache is short, and the request just preempted would come straight back.
        while (
            not preempted
            and self._waiting
            and budget > 0
            and len(self._running) < self.config.max_num_seqs
        ):
            seq = self._waiting[0]
            if not self._may_schedule(seq):
                break
            num_cached = self.block_manager.num_cached_tokens(seq)
            num_new = seq.num_tokens - num_cached
            if num_new > budget:
                if not self.config.enable_chunked_prefill:
                    break  # the whole prompt goes in one step; wait for a step with room
                num_new = budget  # chunked prefill: the rest comes in later steps
            if not self.block_manager.can_allocate(seq, num_new, num_cached):
                break  # FCFS: nobody overtakes the head of the queue
            self._waiting.popleft()
            self.block_manager.allocate(seq, num_new, num_cached)
            seq.num_computed_tokens = num_cached
            self._cache_blocks_ahead(seq, num_new)  # the next request may share them
            seq.status = SequenceStatus.RUNNING
            self._running.append(seq)
            rows.append(self._row(seq, num_new))
            budget -= num_new
        # ANCHOR_END: schedule_waiting

        failed, self._failed = tuple(self._failed), []
        output = SchedulerOutput(
            step=self._step + len(self._in_flight),
            scheduled=tuple(rows),
            block_size=self.block_manager.block_size,
            preempted_ids=tuple(s.seq_id for s in preempted if not s.is_finished),
            failed=failed + tuple(s for s in preempted if s.is_finished),
        )
        self._in_flight.append(output)
        self._after_schedule(output)
        return output

    # ANCHOR: cache_blocks_ahead
    def _cache_blocks_ahead(self, seq: Sequence, num_new_tokens: int) -> None:
        """Register for prefix caching the blocks that seq's row fills this step, now,
        so that a request admitted after it in this step shares them (vLLM:
        `allocate_slots` -> `cache_blocks`). Only tokens whose ids are known are hashed
        (under async scheduling, a placeholder's is not).

        Only a prefill row: a decode's block is registered after its step, in
        `update_from_output`. A step whose rows all decode one token runs the Triton
        decode kernel on CUDA, which stores each request's new K/V in the same kernel that
        reads the cache, so a hit on a block written in that step could be read before it
        is stored; a step with a prefill row runs the write before any read."""
        if not seq.is_prefill:
            return
        known = seq.num_tokens - seq.num_output_placeholders
        end = min(seq.num_computed_tokens + num_new_tokens, known)
        self.block_manager.cache_full_blocks(seq, num_tokens=end)

    # ANCHOR_END: cache_blocks_ahead

    # Hooks for the async scheduler (mini_vllm/engine/async_scheduler.py); here every
    # request may run and nothing happens until update_from_output brings the tokens.
    def _may_schedule(self, seq: Sequence) -> bool:
        return True

    def _after_schedule(self, output: SchedulerOutput) -> None:
        pass

    # ANCHOR: make_room
    def _make_room(self, seq: Sequence, num_new_tokens: int, preempted: list[Sequence]) -> bool:
        """Preempt the most recently admitted running requests until seq's next
        tokens have blocks. False when seq itself had to go."""
        while not self.block_manager.can_append(seq, num_new_tokens):
            victim = self._running.pop()
            self._preempt(victim)
            preempted.append(victim)
            if victim is seq:
                return False
        return True

    # ANCHOR_END: make_room

    # ANCHOR: preempt
    def _preempt(self, seq: Sequence) -> None:
        """Preemption by recompute: drop the request's KV, keep its tokens, and put it
        at the front of the waiting queue; its next admission recomputes prompt +
        generated tokens. A request that has outgrown the whole cache fails instead."""
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        why = self._why_never_runs(seq)
        if why is not None:
            self._fail(seq, why)
            return
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self._waiting.appendleft(seq)

    # ANCHOR_END: preempt

    def _fail(self, seq: Sequence, why: str) -> None:
        """Finish with an error a request that holds no blocks and sits in no queue."""
        self._requests.pop(seq.seq_id, None)
        seq.finish(FinishReason.ERROR, why)

    # -- after the forward --------------------------------------------------------

    # ANCHOR: update_from_output
    def update_from_output(
        self, output: SchedulerOutput, sampled_token_ids: SequenceT[int | None]
    ) -> list[Sequence]:
        """Apply one step's result. `sampled_token_ids` has one entry per row of
        `output.scheduled`, in order; rows with samples_token False are ignored (None
        is fine there). Returns the requests that finished, failures included."""
        if not self._in_flight or output is not self._in_flight[0]:
            raise RuntimeError(
                "this SchedulerOutput is not the step in "
                "flight; pass the one schedule() returned last"
            )
        if len(sampled_token_ids) != len(output.scheduled):
            raise ValueError(
                f"got {len(sampled_token_ids)} sampled token(s) "
                f"for {len(output.scheduled)} scheduled row(s)"
            )
        tokens = []  # checked before anything changes, so a bad token leaves no half-applied step
        for row, token in zip(output.scheduled, sampled_token_ids):
            if row.samples_token and token is None:
                raise ValueError(
                    f"request {row.seq_id!r} reached its last "
                    "token this step but no token was sampled"
                )
            tokens.append(as_token_id(token) if row.samples_token else None)
        self._in_flight.popleft()
        self._step += 1
        return self._apply_output(output, tokens)

    def _apply_output(self, output: SchedulerOutput, tokens: list[int | None]) -> list[Sequence]:
        finished = list(output.failed)
        for row, token in zip(output.scheduled, tokens):
            seq = row.seq
            if seq.is_finished:
                continue  # aborted after this step was scheduled
            seq.num_computed_tokens += row.num_new_tokens
            self.block_manager.cache_full_blocks(seq)
            if token is None:
                continue  # a prefill chunk short of the end: its logits predict nothing
            seq.append_token(token)
            self._finish_if_stopped(seq, token, finished)
        return finished

    def _finish_if_stopped(self, seq: Sequence, token: int, finished: list[Sequence]) -> None:
        reason = self._stop_reason(seq, token)
        if reason is None:
            return
        if seq.status is SequenceStatus.WAITING:
            # Preempted after its step was planned (only the
            # async scheduler plans ahead): it holds no blocks.
            self._waiting.remove(seq)
        else:
            self.block_manager.free(seq)
            self._running.remove(seq)
        self._requests.pop(seq.seq_id, None)
        seq.finish(reason)
        finished.append(seq)

    # ANCHOR_END: update_from_output

    # ANCHOR: stop_reason
    def _stop_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        # Tokens still in flight under async scheduling (placeholders) do not count yet.
        pending = seq.num_output_placeholders
        return check_stop(
            token,
            seq.num_output_tokens - pending,
            seq.sampling_params,
            self.eos_token_ids,
            num_tokens=seq.num_tokens - pending,
            max_model_len=self.config.max_model_len,
        )

    # ANCHOR_END: stop_reason

    def __repr__(self) -> str:
        return (
            f"Scheduler(step {self._step}, {len(self._running)} running, {len(self._waiting)} "
            f"waiting, {self.num_preemptions} preemptions, {self.block_manager!r})"
        )
