"""The engine loop: requests in, one scheduler step and one model step at a time, outputs out.

vLLM counterpart: vllm/v1/engine/llm_engine.py and vllm/v1/engine/core.py
(`EngineCore.step`: schedule, execute the model, update from the output;
`LLMEngine.abort_request`). nano-vllm: nanovllm/engine/llm_engine.py. Everything runs
in one process here (with tensor parallelism, rank 0: the other ranks' processes run what
`MultiprocExecutor` sends them); vLLM runs the scheduler and the workers in separate
processes and overlaps them.

Failure rules: a request the model cannot take (token ids outside its vocabulary, an
empty prompt) is refused by `add_request` with a UserError, before it is queued. A step
that raises, wherever (the forward, the sampler, the update, a KeyboardInterrupt), is
taken back before the exception leaves `step()`: the scheduler forgets the steps in
flight and every unfinished request waits to be recomputed from its tokens, so the
engine can go on and its requests finish with the tokens they would have had. vLLM's
engine core process dies on such an exception instead (the client gets
EngineDeadError). A device fault that corrupts the CUDA context is beyond any retry.
An engine serves one caller at a time; a second thread is refused at once.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterable

import torch

from mini_vllm.distributed.parallel_state import get_tp_group
from mini_vllm.engine.async_scheduler import AsyncScheduler
from mini_vllm.engine.block_manager import BlockManager
from mini_vllm.engine.engine_config import EngineConfig
from mini_vllm.engine.kv_cache_plan import device_memory, plan_kv_cache
from mini_vllm.engine.model_runner import ModelRunner, SampledTokens
from mini_vllm.engine.scheduler import Scheduler
from mini_vllm.engine.scheduler_output import SchedulerOutput
from mini_vllm.engine.sequence import FinishReason, Sequence, as_token_id
from mini_vllm.engine.stats import EngineStats
from mini_vllm.errors import UserError
from mini_vllm.executor import Executor
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.utils import OneCallerAtATime

__all__ = ["LLMEngine", "check_prompt_ids"]


def check_prompt_ids(prompt_token_ids: Iterable[int], vocab_size: int) -> list[int]:
    """The prompt as a list of token ids of a model with `vocab_size` ids, or a UserError
    saying what is wrong (the engine's check, which the server makes before sending)."""
    if isinstance(prompt_token_ids, (str, bytes, bytearray)) or not isinstance(
        prompt_token_ids, Iterable
    ):
        raise UserError(
            "a prompt here is a sequence of token ids (ints), got "
            f"{type(prompt_token_ids).__name__}; encode text with the tokenizer first"
        )
    try:
        ids = [as_token_id(token) for token in prompt_token_ids]
    except TypeError as exc:
        raise UserError(f"a prompt is a sequence of token ids: {exc}") from None
    if not ids:
        raise UserError("the prompt is empty (no tokens): give at least one token")
    outside = sorted({token for token in ids if token >= vocab_size})
    if outside:
        raise UserError(
            f"token id(s) {outside[:5]}{' ...' if len(outside) > 5 else ''} are outside "
            f"the model's vocabulary (ids 0..{vocab_size - 1})"
        )
    return ids


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig,
        model: torch.nn.Module,
        tokenizer=None,
        capture_progress: bool = True,
        model_executor: Executor | None = None,
    ) -> None:
        self.config = config
        # Tensor parallelism: the other ranks' processes; None for the single-process engine.
        self.model_executor = model_executor
        self.model = model
        self.tokenizer = tokenizer
        weight = next(model.parameters())
        # ANCHOR: engine_init
        # The cache's size, checked against max_model_len and free memory before any
        # allocation (mini_vllm/engine/kv_cache_plan.py).
        plan = plan_kv_cache(
            config, model.config, weight.dtype, weight.device, **device_memory(weight.device)
        )
        self.max_model_len = plan.max_model_len
        # Every rank's cache gets as many blocks as the smallest can hold (one rank of one: this).
        num_blocks = get_tp_group().all_reduce_min(plan.num_blocks)
        self.block_manager = BlockManager(
            num_blocks, config.block_size, enable_prefix_caching=config.enable_prefix_caching
        )
        eos = model.config.eos_token_id
        scheduler_class = AsyncScheduler if config.async_scheduling else Scheduler
        self.scheduler = scheduler_class(
            config.scheduler_config(self.max_model_len), self.block_manager, eos_token_id=eos
        )
        self.runner = ModelRunner(model, config, self.max_model_len, num_blocks)
        if model_executor is not None:
            model_executor.driver_runner = self.runner
        # ANCHOR_END: engine_init
        # Phase 05: compile (if asked), then capture every graph now, before serving;
        # the capture window then closes.
        self.runner.compile_model()
        self.runner.capture_model(progress=capture_progress)
        self.stats = EngineStats()
        self._request_ids = itertools.count()  # next() on it is atomic: no two requests share an id
        # Every request is reported ended exactly once, by step() or abort_request(): the
        # ones added and not reported yet, and those that ended in a step that then raised.
        self._unreported: dict[Hashable, Sequence] = {}
        self._ended_in_failed_step: list[Sequence] = []
        # Async scheduling: the step launched last, whose tokens have not been read yet.
        self._in_flight: tuple[SchedulerOutput, SampledTokens] | None = None
        self._one_caller = OneCallerAtATime(
            "this LLMEngine",
            advice="use one engine per thread, or one thread that owns the engine and takes "
            "requests from the others (what a server does)",
        )

    # ANCHOR: add_request
    def add_request(
        self, prompt_token_ids: Iterable[int], params: SamplingParams | None = None
    ) -> Sequence:
        """Queue a request. A prompt the model cannot take (empty, or a token id outside
        its vocabulary) is refused here with a UserError; one the engine can never serve
        (max_model_len tokens or more) finishes with an error at the next step. Either way
        the other requests are not affected."""
        with self._one_caller:
            seq = Sequence(next(self._request_ids), self.check_prompt(prompt_token_ids), params)
            self.scheduler.add_request(seq)
            self._unreported[seq.seq_id] = seq
            return seq

    def check_prompt(self, prompt_token_ids: Iterable[int]) -> list[int]:
        """The prompt as a list of token ids of this model, or a UserError saying what is wrong."""
        return check_prompt_ids(prompt_token_ids, self.model.config.vocab_size)

    # ANCHOR_END: add_request

    # ANCHOR: abort_request
    def abort_request(self, request_ids: Hashable | Iterable[Hashable]) -> list[Sequence]:
        """End requests now (finish_reason "abort") and free their KV blocks; ids that are
        unknown or already finished are skipped. vLLM: `LLMEngine.abort_request`."""
        if isinstance(request_ids, (str, bytes)) or not isinstance(request_ids, Iterable):
            request_ids = [request_ids]
        with self._one_caller:
            aborted = self.scheduler.finish_requests(request_ids, FinishReason.ABORT)
            for seq in aborted:
                del self._unreported[seq.seq_id]
            self.runner.free_requests([seq.seq_id for seq in aborted])
            self.stats.num_aborted_requests += len(aborted)
            return aborted

    # ANCHOR_END: abort_request

    def stop_request(self, request_id: Hashable) -> Sequence | None:
        """End a request as finished normally ("stop"): its text reached a stop string,
        which only the detokenising caller can see. vLLM's output processor does the same
        (`OutputProcessor.process_outputs` aborts the request in the engine core)."""
        with self._one_caller:
            stopped = self.scheduler.finish_requests([request_id], FinishReason.STOP)
            for seq in stopped:
                del self._unreported[seq.seq_id]
            self.runner.free_requests([seq.seq_id for seq in stopped])
            return stopped[0] if stopped else None

    def has_unfinished_requests(self) -> bool:
        """True while a request waits, runs, or has ended and not been reported yet."""
        return (
            self.scheduler.has_unfinished_requests()
            or self._in_flight is not None
            or bool(self._ended_in_failed_step)
        )

    # ANCHOR: engine_step
    def step(self) -> list[Sequence]:
        """One scheduler step and one forward; returns the requests that finished in it.

        If anything in the step raises, the step is taken back before the exception
        propagates: the engine stays usable and no block stays held by it.
        """
        with self._one_caller:
            try:
                return self._step_async() if self.config.async_scheduling else self._step_sync()
            except BaseException as exc:
                self._take_back_steps(exc)
                raise

    def _step_sync(self) -> list[Sequence]:
        output = self.scheduler.schedule()
        self._check_progress(output)
        sampled = self._execute_model(output) if not output.is_empty else []
        finished = self.scheduler.update_from_output(output, sampled)
        return self._after_step(output, finished)

    def _execute_model(self, output: SchedulerOutput) -> list[int | None]:
        if self.model_executor is not None:  # tensor parallelism: every rank runs the step
            return self.model_executor.execute_model(output)
        return self.runner.execute_model(output)

    # ANCHOR_END: engine_step

    # ANCHOR: engine_step_async
    def _step_async(self) -> list[Sequence]:
        """Launch this step, then take in the previous step's tokens while the device works.

        Returns the requests that finished with the previous step's tokens. vLLM's
        `EngineCore.step_with_batch_queue` keeps the same one-step lag.
        """
        output = self.scheduler.schedule()  # may plan on placeholders of the step in flight
        self._check_progress(output)
        launched = (
            self.runner.execute_model(output, non_blocking=True) if not output.is_empty else None
        )
        finished: list[Sequence] = []
        if self._in_flight is not None:
            previous, tokens = self._in_flight
            finished = self.scheduler.update_from_output(
                previous, tokens.get()
            )  # waits for that step only
        if launched is None:  # nothing to wait for: close the step at once
            finished += self.scheduler.update_from_output(output, [])
            self._in_flight = None
        else:
            self._in_flight = (output, launched)
        return self._after_step(output, finished)

    # ANCHOR_END: engine_step_async

    # ANCHOR: take_back_steps
    def _take_back_steps(self, exc: BaseException) -> None:
        """After an exception in a step: forget the steps in flight, send every unfinished
        request back to wait for recompute (its blocks freed), and drop the runner's
        per-request state, which is rebuilt from each request's tokens when it runs again."""
        self._in_flight = None
        requests = self.scheduler.take_back_steps()
        self.runner.reset_request_state()
        # Requests the failed step finished: the next step reports them.
        self._ended_in_failed_step = [s for s in self._unreported.values() if s.is_finished]
        self.stats.num_steps_taken_back += 1
        executor_failed = self.model_executor is not None and self.model_executor.failed
        if hasattr(exc, "add_note") and not executor_failed:  # Python 3.11+
            exc.add_note(
                f"mini_vllm took the step back: {len(requests)} unfinished request(s) wait to "
                "be recomputed and the engine can go on (LLM.generate aborts its own requests)"
            )

    # ANCHOR_END: take_back_steps

    def _check_progress(self, output: SchedulerOutput) -> None:
        """An empty step with requests left and no step in flight would repeat for ever."""
        if (
            output.is_empty
            and not output.failed
            and self._in_flight is None
            and self.scheduler.has_unfinished_requests()
        ):
            running, waiting = self.scheduler.get_request_counts()
            raise RuntimeError(
                f"the scheduler planned nothing although {waiting} request(s) wait and "
                f"{running} run, and no step is in flight: the engine would loop for ever "
                "(a scheduler bug; please report it with the engine's configuration)"
            )

    def _after_step(self, output: SchedulerOutput, finished: list[Sequence]) -> list[Sequence]:
        ended, self._ended_in_failed_step = self._ended_in_failed_step + finished, []
        finished = [seq for seq in ended if self._unreported.pop(seq.seq_id, None) is seq]
        if not output.is_empty:
            self.stats.record(self.runner.last_step)
        self.stats.num_preemptions = self.scheduler.num_preemptions
        self.stats.num_failed_requests += sum(
            1 for seq in finished if seq.finish_reason is FinishReason.ERROR
        )
        self.runner.free_requests([seq.seq_id for seq in finished])
        return finished
