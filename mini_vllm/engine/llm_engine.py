"""The engine loop: requests in, one scheduler step and one model step at a time, outputs out.

vLLM counterpart: vllm/v1/engine/llm_engine.py and vllm/v1/engine/core.py
(`EngineCore.step`: schedule, execute the model, update from the output). nano-vllm:
nanovllm/engine/llm_engine.py. Everything runs in one process here; vLLM runs the
scheduler and the workers in separate processes and overlaps them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from mini_vllm.engine.async_scheduler import AsyncScheduler
from mini_vllm.engine.block_manager import BlockManager
from mini_vllm.engine.engine_config import EngineConfig
from mini_vllm.engine.model_runner import ModelRunner, SampledTokens
from mini_vllm.engine.scheduler import Scheduler
from mini_vllm.engine.scheduler_output import SchedulerOutput
from mini_vllm.engine.sequence import FinishReason, Sequence
from mini_vllm.engine.stats import EngineStats
from mini_vllm.sampling_params import SamplingParams

__all__ = ["LLMEngine"]


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig,
        model: torch.nn.Module,
        tokenizer=None,
        capture_progress: bool = True,
    ) -> None:
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        model_len = model.config.max_position_embeddings
        self.max_model_len = min(config.max_model_len or model_len, model_len)
        # ANCHOR: engine_init
        # Default KV budget: every running request can reach the full length.
        num_blocks = config.num_kv_blocks or config.max_num_seqs * math.ceil(
            self.max_model_len / config.block_size
        )
        self.block_manager = BlockManager(
            num_blocks, config.block_size, enable_prefix_caching=config.enable_prefix_caching
        )
        eos = model.config.eos_token_id
        scheduler_class = AsyncScheduler if config.async_scheduling else Scheduler
        self.scheduler = scheduler_class(
            config.scheduler_config(self.max_model_len), self.block_manager, eos_token_id=eos
        )
        self.runner = ModelRunner(model, config, self.max_model_len, num_blocks)
        # ANCHOR_END: engine_init
        # Phase 05: compile (if asked), then capture every graph now, before serving;
        # the capture window then closes.
        self.runner.compile_model()
        self.runner.capture_model(progress=capture_progress)
        self.stats = EngineStats()
        self._next_id = 0
        # Async scheduling: the step launched last, whose tokens have not been read yet.
        self._in_flight: tuple[SchedulerOutput, SampledTokens] | None = None

    def add_request(self, prompt_token_ids: Iterable[int], params: SamplingParams) -> Sequence:
        """Queue a request. One the engine can never serve (longer than max_model_len, or
        more KV than the whole cache) finishes with an error at its first step; the
        other requests are not affected. An empty prompt is refused here (ValueError)."""
        seq = Sequence(self._next_id, list(prompt_token_ids), params)
        self._next_id += 1
        self.scheduler.add_request(seq)
        return seq

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or self._in_flight is not None

    # ANCHOR: engine_step
    def step(self) -> list[Sequence]:
        """One scheduler step and one forward; returns the requests that finished in it."""
        if self.config.async_scheduling:
            return self._step_async()
        output = self.scheduler.schedule()
        self._check_progress(output)
        sampled = self.runner.execute_model(output) if not output.is_empty else []
        finished = self.scheduler.update_from_output(output, sampled)
        return self._after_step(output, finished)

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
        if not output.is_empty:
            self.stats.record(self.runner.last_step)
        self.stats.num_preemptions = self.scheduler.num_preemptions
        self.stats.num_failed_requests += sum(
            1 for seq in finished if seq.finish_reason is FinishReason.ERROR
        )
        self.runner.free_requests([seq.seq_id for seq in finished])
        return finished
