"""Async scheduling: plan step N+1 while the GPU still computes step N.

vLLM counterpart: vllm/v1/core/sched/async_scheduler.py (`AsyncScheduler`:
`_update_after_schedule` counts a request's `num_output_placeholders` up when a step will
sample for it, `_update_request_with_output` counts it down when the token arrives),
driven by `EngineCore.step_with_batch_queue` in vllm/v1/engine/core.py and fed by the
runner's `AsyncGPUModelRunnerOutput` (vllm/v1/worker/gpu_model_runner.py).

With synchronous scheduling every step ends by copying the sampled tokens to the host,
and the next step cannot be planned before they arrive: the GPU idles while Python
schedules, flattens inputs and launches. Decode barely needs the tokens to plan, though:
every running request computes exactly one token, at a position known in advance. So
this scheduler plans step N+1 right after launching step N, before N's tokens exist:

- when a step is scheduled, each row's tokens count as computed at once (the GPU
  runs steps in order, so they will be by the time the next step reads the cache), and
  a row that samples appends a PLACEHOLDER token to its request;
- the next step feeds that placeholder from the previous step's samples, which stay
  on the device (the model runner copies them into `input_ids` there);
- when step N's tokens reach the host, `update_from_output` writes them over the
  oldest placeholders and applies the stop rules to the real tokens.

The price: a request that stops on EOS at step N has already been scheduled for step
N+1; that row's work is thrown away (its token is dropped, its blocks freed after the
GPU has used them, which stream order makes safe). A request whose `max_tokens` or
`max_model_len` is reached by its tokens in flight is not scheduled again. A request
that outgrows the whole cache while a token of its is in flight fails only when that
token has landed, so it ends with the tokens synchronous scheduling would give it.
"""

from __future__ import annotations

from mini_vllm.engine.scheduler import Scheduler
from mini_vllm.engine.scheduler_output import SchedulerOutput
from mini_vllm.engine.sequence import Sequence, SequenceStatus

__all__ = ["AsyncScheduler"]


class AsyncScheduler(Scheduler):
    """A Scheduler that may run one step ahead of the tokens it has received."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.max_steps_in_flight = 2  # the step the GPU runs and the one being planned

    # ANCHOR: async_may_schedule
    def _may_schedule(self, seq: Sequence) -> bool:
        if seq.status is SequenceStatus.WAITING:
            # (Re)admission hashes and recomputes the tokens: they must all be real.
            return seq.num_output_placeholders == 0
        if seq.num_output_placeholders == 0:
            return True  # nothing in flight: the synchronous rules hold
        # Tokens in flight already reach a length cap: the request ends when they land.
        params = seq.sampling_params
        return (
            seq.num_output_tokens < params.max_tokens and seq.num_tokens < self.config.max_model_len
        )

    # ANCHOR_END: async_may_schedule

    # ANCHOR: async_after_schedule
    def _after_schedule(self, output: SchedulerOutput) -> None:
        for row in output.scheduled:
            seq = row.seq
            seq.num_computed_tokens += row.num_new_tokens
            if row.samples_token:
                seq.append_placeholder()

    # ANCHOR_END: async_after_schedule

    # ANCHOR: async_apply_output
    def _apply_output(self, output: SchedulerOutput, tokens: list[int | None]) -> list[Sequence]:
        finished = list(output.failed)
        for row, token in zip(output.scheduled, tokens):
            seq = row.seq
            if seq.is_finished:
                continue  # it stopped at an earlier step: this row was computed for nothing
            if seq.status is SequenceStatus.RUNNING:
                # Blocks whose tokens this step computed (all real by now) can be shared.
                self.block_manager.cache_full_blocks(seq, num_tokens=row.context_len)
            if token is None:
                continue
            seq.resolve_placeholder(token)
            self._finish_if_stopped(seq, token, finished)
            if seq.status is SequenceStatus.WAITING and seq.num_output_placeholders == 0:
                why = self._why_never_runs(seq)  # preempted for good: see _fail below
                if why is not None:
                    self._waiting.remove(seq)
                    super()._fail(seq, why)
                    finished.append(seq)
        return finished

    # ANCHOR_END: async_apply_output

    def _fail(self, seq: Sequence, why: str) -> None:
        if seq.num_output_placeholders:
            # Its tokens in flight still count (the synchronous scheduler has them by
            # now): wait, unschedulable, until they land, then fail in _apply_output.
            self._waiting.appendleft(seq)
            return
        super()._fail(seq, why)
