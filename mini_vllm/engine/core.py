"""The engine core: the loop that takes requests in, steps the engine and sends tokens out.

vLLM counterpart: vllm/v1/engine/core.py (`EngineCore`, which owns the scheduler and the
executor, and `EngineCoreProc`, which runs its busy loop in a process of its own and talks
to the server over ZeroMQ: `run_busy_loop`, `_process_input_queue`,
`_process_engine_step`), with the messages of vllm/v1/engine/__init__.py
(`EngineCoreRequest`, `EngineCoreOutput`, `EngineCoreOutputs`) and the stats of
vllm/v1/metrics/stats.py (`SchedulerStats`).

The loop knows nothing about HTTP, asyncio or text. Each turn it

1. applies every command that came in since the last turn (add a request, abort one, finish
   one whose text reached a stop string), waiting for one only when it has nothing to step;
2. steps the engine once;
3. sends out one `EngineCoreOutputs`: each request's new tokens since the last turn, the
   finish reason of those that ended, and the counters a dashboard shows.

Where the loop runs is the client's choice (mini_vllm/engine/core_client.py): a thread of
the server's process, or a process of its own, where the server's Python never takes the
interpreter lock away from a step. The loop is the same in both.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from mini_vllm.engine.sequence import Sequence
from mini_vllm.engine.stats import EngineStats
from mini_vllm.errors import UserError
from mini_vllm.sampling_params import SamplingParams

__all__ = [
    "EngineCore",
    "EngineCoreOutput",
    "EngineCoreOutputs",
    "EngineCoreRequest",
    "EngineInfo",
    "SchedulerStats",
]

logger = logging.getLogger(__name__)


# -- the messages ----------------------------------------------------------------------


@dataclass(frozen=True)
class EngineCoreRequest:
    """Add a request (its prompt already tokenized and checked by the server)."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams


@dataclass(frozen=True)
class AbortRequest:
    """End a request whose client went away; its KV blocks are freed."""

    request_id: str


@dataclass(frozen=True)
class FinishRequest:
    """End a request as finished ("stop"): the server found a stop string in its text, which
    only the server decodes (vLLM's output processor stops requests in the core the same way)."""

    request_id: str


# ANCHOR: outputs
@dataclass(frozen=True)
class EngineCoreOutput:
    """What one turn of the loop brought one request."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None  # set on the request's last output only
    error: str | None = None  # finish_reason "error": what went wrong
    status_code: int = 200  # finish_reason "error": the HTTP status it calls for
    # With SamplingParams.logprobs: one entry a new token, (token, logprob, rank,
    # [(alternative id, logprob), ...]) as `Sequence.token_logprobs` holds it.
    logprobs: list[tuple] | None = None
    # With SamplingParams.prompt_logprobs, once (in the first output after the prompt was
    # computed): one entry a prompt token, None for the first.
    prompt_logprobs: list[tuple | None] | None = None


@dataclass(frozen=True)
class SchedulerStats:
    """The engine's counters after a turn, for the server's metrics."""

    num_running_reqs: int
    num_waiting_reqs: int
    kv_cache_usage: float  # share of the KV blocks in use
    engine: EngineStats  # a copy of the running counts (no step records)


@dataclass(frozen=True)
class EngineCoreOutputs:
    """One turn of the loop: every request's output, and the stats after it (None when the
    turn ran no step)."""

    outputs: list[EngineCoreOutput]
    stats: SchedulerStats | None = None


# ANCHOR_END: outputs


@dataclass(frozen=True)
class EngineInfo:
    """What the server needs to know of the engine to check and render requests: sent once,
    when the warm-up is over (vLLM's server builds the same from its configuration and the
    core's start-up handshake)."""

    model: str
    tokenizer: object
    max_model_len: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    block_size: int
    num_kv_blocks: int
    warmup_seconds: float
    # The capture's report (None without graphs): seconds, bytes held, graphs captured.
    capture_seconds: float | None = None
    capture_memory_bytes: int | None = None
    capture_num_graphs: int | None = None

    @classmethod
    def of(cls, llm, warmup_seconds: float) -> EngineInfo:
        engine = llm.engine
        report = engine.runner.capture_report
        return cls(
            model=llm.config.model,
            tokenizer=llm.tokenizer,
            max_model_len=engine.max_model_len,
            vocab_size=engine.model.config.vocab_size,
            eos_token_ids=tuple(sorted(engine.scheduler.eos_token_ids)),
            block_size=engine.block_manager.block_size,
            num_kv_blocks=engine.block_manager.num_blocks,
            warmup_seconds=warmup_seconds,
            capture_seconds=None if report is None else report.seconds,
            capture_memory_bytes=None if report is None else (report.graph_memory_bytes or 0),
            capture_num_graphs=None if report is None else report.num_graphs,
        )

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)


# -- the core --------------------------------------------------------------------------


@dataclass
class _LiveRequest:
    """A request in the engine, as the core tracks it."""

    request_id: str
    seq: Sequence
    num_sent: int = 0  # output tokens sent out so far
    prompt_logprobs_sent: bool = False


@dataclass
class EngineCore:
    """One `LLM` and the requests it serves, turned by `run_busy_loop`."""

    llm: object  # mini_vllm.llm.LLM
    _live: dict[str, _LiveRequest] = field(default_factory=dict)
    _outputs: list[EngineCoreOutput] = field(default_factory=list)

    def __post_init__(self) -> None:
        # A server runs for days: count the steps, keep no record of each.
        self.llm.engine.stats.keep_step_records = False

    # ANCHOR: busy_loop
    def run_busy_loop(
        self,
        next_commands: Callable[[bool], list | None],
        send: Callable[[EngineCoreOutputs], None],
    ) -> None:
        """Turn until `next_commands` returns None (stop).

        `next_commands(wait)` returns the commands that came in (waiting for at least one
        when `wait` is true); `send` takes each turn's outputs.
        """
        engine = self.llm.engine
        while True:
            commands = next_commands(not engine.has_unfinished_requests())
            if commands is None:
                return
            for command in commands:
                self.apply(command)
            stats = None
            if engine.has_unfinished_requests():
                self.step()
                stats = self.scheduler_stats()
            outputs = self.take_outputs()
            if outputs or stats is not None:
                send(EngineCoreOutputs(outputs, stats))

    # ANCHOR_END: busy_loop

    def apply(self, command) -> None:
        engine = self.llm.engine
        if isinstance(command, EngineCoreRequest):
            self._add(command)
        elif isinstance(command, AbortRequest):
            live = self._live.pop(command.request_id, None)
            if live is not None:  # else: finished already, or never added
                engine.abort_request(live.seq.seq_id)
                logger.info(
                    "request %s aborted (its client went away); its blocks are free",
                    command.request_id,
                )
        elif isinstance(command, FinishRequest):
            live = self._live.get(command.request_id)
            if live is not None and not live.seq.is_finished:
                engine.stop_request(live.seq.seq_id)
                # Its last output goes out this turn: with no other request the engine may
                # not step again, and nothing else would send it.
                self._collect_tokens()
        else:
            raise TypeError(f"not an engine core command: {command!r}")

    def _add(self, request: EngineCoreRequest) -> None:
        if request.request_id in self._live:  # its outputs would go to two requests
            self._fail(
                request.request_id,
                f"request id {request.request_id!r} belongs to a request still running; "
                "give each request its own id",
                400,
            )
            return
        try:
            seq = self.llm.engine.add_request(request.prompt_token_ids, request.params)
        except UserError as exc:  # the server checks first; this is the last line
            self._fail(request.request_id, str(exc), 400)
            return
        self._live[request.request_id] = _LiveRequest(request.request_id, seq)

    def _fail(self, request_id: str, message: str, status_code: int) -> None:
        self._outputs.append(EngineCoreOutput(request_id, [], "error", message, status_code))

    def step(self) -> None:
        """One engine step; a step that raises fails every request held when it began (the
        engine has taken the step back, so the requests that come after are served)."""
        engine = self.llm.engine
        held = list(self._live.values())
        try:
            engine.step()
        except Exception as exc:
            logger.exception("an engine step failed; failing the %d request(s) it held", len(held))
            engine.abort_request([live.seq.seq_id for live in held])
            message = (
                f"the engine step failed ({type(exc).__name__}: {exc}); this request was "
                "ended, the server goes on: send it again"
            )
            for live in held:
                self._live.pop(live.request_id, None)
                self._fail(live.request_id, message, 500)
            return
        self._collect_tokens()

    # ANCHOR: collect_tokens
    def _collect_tokens(self) -> None:
        """Each live request's tokens since the last turn (those the device still holds under
        async scheduling wait for the next turn)."""
        for request_id, live in list(self._live.items()):
            seq = live.seq
            ready = seq.num_output_tokens - seq.num_output_placeholders
            start = seq.num_prompt_tokens + live.num_sent
            new = seq.tokens(start, seq.num_prompt_tokens + ready) if ready > live.num_sent else []
            if not new and not seq.is_finished:
                continue
            logprobs, prompt_logprobs = self._logprobs_of(live, len(new))
            live.num_sent += len(new)
            if not seq.is_finished:
                self._outputs.append(
                    EngineCoreOutput(request_id, new, None, None, 200, logprobs, prompt_logprobs)
                )
                continue
            del self._live[request_id]
            reason = seq.finish_reason.value
            if reason == "error":  # a request the engine can never serve (the server checks)
                self._outputs.append(EngineCoreOutput(request_id, new, "error", seq.error, 400))
            else:
                self._outputs.append(
                    EngineCoreOutput(request_id, new, reason, None, 200, logprobs, prompt_logprobs)
                )

    # ANCHOR_END: collect_tokens

    @staticmethod
    def _logprobs_of(live: _LiveRequest, count: int) -> tuple[list | None, list | None]:
        """The log-probabilities of the `count` tokens about to be sent, and, once, those
        of the prompt (the prompt is computed by then: a token came, or the request ended)."""
        seq, params = live.seq, live.seq.sampling_params
        logprobs = prompt_logprobs = None
        if params.logprobs is not None:
            logprobs = [seq.token_logprobs.get(live.num_sent + i) for i in range(count)]
        if params.prompt_logprobs is not None and not live.prompt_logprobs_sent:
            live.prompt_logprobs_sent = True
            kept = seq.prompt_logprobs
            prompt_logprobs = [None] + [kept.get(p) for p in range(1, seq.num_prompt_tokens)]
        return logprobs, prompt_logprobs

    def take_outputs(self) -> list[EngineCoreOutput]:
        outputs, self._outputs = self._outputs, []
        return outputs

    def scheduler_stats(self) -> SchedulerStats:
        engine = self.llm.engine
        running, waiting = engine.scheduler.get_request_counts()
        blocks = engine.block_manager
        return SchedulerStats(
            num_running_reqs=running,
            num_waiting_reqs=waiting,
            kv_cache_usage=blocks.num_used_blocks / blocks.num_blocks,
            engine=engine.stats.counts(),
        )

    def fail_all(self, message: str, status_code: int) -> list[EngineCoreOutput]:
        """End every live request with an error (the loop stops: nobody will step them)."""
        for request_id in self._live:
            self._fail(request_id, message, status_code)
        self._live.clear()
        return self.take_outputs()
