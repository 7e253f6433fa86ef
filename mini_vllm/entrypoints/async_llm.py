"""The engine as an HTTP server sees it: an async generator of tokens per request.

vLLM counterpart: vllm/v1/engine/async_llm.py (`AsyncLLM.generate`, an async generator of
outputs per request; `AsyncLLM.abort`; `output_handler`, the task that takes the core's
outputs and routes them) with vllm/v1/engine/output_processor.py (`RequestOutputCollector`,
the per-request queue, and the latency stats it records).

How it works:

- The engine core (mini_vllm/engine/core.py) owns the `LLM` and turns its loop: commands
  in, one step, each request's new tokens out. A client (mini_vllm/engine/core_client.py)
  runs it in a process of its own (`multiprocess=True`, what `serve` does, as vLLM) or in a
  thread of this one (the tests, and a reader with a debugger). The core warms up first:
  load the weights, compile, capture every graph of the ladder. `is_ready` (and `/health`)
  turns true only after it.
- A handler calls `generate(...)`, an async generator. It registers the request (its event
  loop and its own `asyncio.Queue`), sends the core an add command, and awaits the queue.
- The client's thread hands each turn's outputs to `_on_outputs`, which routes them to
  their requests' queues with `loop.call_soon_threadsafe(...)`, the only way another thread
  may touch an asyncio queue: one call a turn for all the requests of an event loop, not one
  a request. The latency metrics (TTFT, ITL) are taken there, as the tokens reach the server.
- A handler that stops listening (the client disconnected, or the handler was cancelled)
  closes the generator, whose `finally` sends an abort: the core ends the request and
  frees its KV blocks at its next turn.
- A step that raises fails every request the engine held when it began (an error, status
  500); the engine has taken the step back, so the requests that come after are served. A
  core that dies (its process killed) fails every request with a 500 and the server
  reports it on `/health`.
- `shutdown()` stops the core; requests still held get an error (503).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from mini_vllm.engine.core import (
    AbortRequest,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineInfo,
    FinishRequest,
)
from mini_vllm.engine.core_client import ShuttingDown, make_client
from mini_vllm.entrypoints.metrics import PrometheusStatLogger
from mini_vllm.sampling_params import SamplingParams

__all__ = ["AsyncLLM", "RequestOutputDelta"]

logger = logging.getLogger(__name__)

# What a handler's queue receives: a turn's output for its request.
RequestOutputDelta = EngineCoreOutput


@dataclass
class _Pending:
    """A request this server sent the core and still waits on."""

    loop: asyncio.AbstractEventLoop  # the handler's loop, and its queue for this request
    queue: asyncio.Queue
    arrival: float  # time.monotonic() when the HTTP request came in
    num_prompt_tokens: int
    last_token_time: float | None = None


def _put_all(items: list[tuple[asyncio.Queue, EngineCoreOutput]]) -> None:
    """Runs in the event loop: one turn's outputs into their queues."""
    for deltas, delta in items:
        deltas.put_nowait(delta)


def _route(routed: list[tuple[_Pending, EngineCoreOutput]]) -> None:
    """Hand outputs to their requests' event loops: one call a loop, not one a request."""
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for pending, output in routed:
        by_loop.setdefault(pending.loop, []).append((pending.queue, output))
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(_put_all, items)
        except RuntimeError:  # that event loop is closed: nobody listens any more
            pass


class AsyncLLM:
    """The server's engine: an engine core (in a thread, or in a process of its own with
    `multiprocess=True`) and an async generator per request.

    `engine_factory` builds the `LLM` (where the core runs: the warm-up); in a process of its
    own it must pickle (`functools.partial(LLM, **kwargs)`). Tests pass one that waits, to
    watch `/health` answer 503 during the warm-up.
    """

    def __init__(
        self,
        engine_factory: Callable[[], object],
        metrics: PrometheusStatLogger | None = None,
        on_startup_failure: Callable[[BaseException], None] | None = None,
        multiprocess: bool = False,
    ) -> None:
        self.metrics = metrics
        self._on_startup_failure = on_startup_failure
        self.multiprocess = multiprocess
        self.info: EngineInfo | None = None  # set once the warm-up is done
        self.startup_error: BaseException | None = None
        self.engine_error: BaseException | None = None  # why a running core stopped
        self._ready = threading.Event()
        self._done = threading.Event()  # the core has stopped (or never started)
        # Requests sent to the core and not finished, under the lock: the handlers add and
        # remove them, the client's thread routes outputs to them. Once `_closed` is set
        # nobody takes requests any more: one that comes then is failed at once.
        self._pending: dict[str, _Pending] = {}
        self._closed = False
        self._lock = threading.Lock()
        self._client = make_client(engine_factory, multiprocess)

    # -- life cycle ----------------------------------------------------------------------

    def start(self) -> None:
        self._client.start(self._on_ready, self._on_outputs, self._on_dead)

    @property
    def llm(self):
        """The `LLM` when the core runs in this process (a thread), else None."""
        return self._client.llm

    @property
    def warmup_seconds(self) -> float | None:
        return None if self.info is None else self.info.warmup_seconds

    @property
    def is_ready(self) -> bool:
        """True once the warm-up is done and until the core stops."""
        return self._ready.is_set() and not self._done.is_set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until ready or failed; True when ready."""
        self._ready.wait(timeout)
        return self.is_ready

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the core (after the step in progress) and wait for it."""
        self._client.shutdown(timeout)
        self._on_dead(ShuttingDown("the server is shutting down"), True)

    # -- what the handlers call ----------------------------------------------------------

    # ANCHOR: generate
    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival: float | None = None,
    ) -> AsyncIterator[RequestOutputDelta]:
        """The request's tokens as they come, delta by delta, until one with a finish_reason.

        Use it inside `contextlib.aclosing(...)`: leaving early (or being cancelled)
        closes it, which aborts the request in the engine.
        """
        deltas: asyncio.Queue[RequestOutputDelta] = asyncio.Queue()
        arrival = time.monotonic() if arrival is None else arrival
        pending = _Pending(asyncio.get_running_loop(), deltas, arrival, len(prompt_token_ids))
        refusal = None
        with self._lock:
            if self._closed:
                why = self.engine_error or self.startup_error or "the server is shutting down"
                refusal = RequestOutputDelta(
                    request_id, [], "error", f"no engine to serve it: {why}", 503
                )
            elif request_id in self._pending:  # its outputs would go to two queues
                refusal = RequestOutputDelta(
                    request_id,
                    [],
                    "error",
                    f"request id {request_id!r} belongs to a request still running; "
                    "give each request its own id",
                    400,
                )
            else:
                self._pending[request_id] = pending
                self._client.send(EngineCoreRequest(request_id, list(prompt_token_ids), params))
        if refusal is not None:
            yield refusal
            return
        finished = False
        try:
            while not finished:
                delta = await deltas.get()
                # Behind (the client reads slower than the engine steps)? Take every delta
                # waiting as one: fewer, larger chunks, as vLLM's RequestOutputCollector.
                while delta.finish_reason is None and not deltas.empty():
                    later = deltas.get_nowait()
                    logprobs = None
                    if delta.logprobs is not None or later.logprobs is not None:
                        logprobs = (delta.logprobs or []) + (later.logprobs or [])
                    delta = RequestOutputDelta(
                        request_id,
                        delta.new_token_ids + later.new_token_ids,
                        later.finish_reason,
                        later.error,
                        later.status_code,
                        logprobs,
                        delta.prompt_logprobs or later.prompt_logprobs,
                    )
                finished = delta.finish_reason is not None
                yield delta
        finally:
            if not finished:
                self.abort(request_id)

    # ANCHOR_END: generate

    # ANCHOR: abort
    def abort(self, request_id: str) -> None:
        """End the request and free its blocks (at the core's next turn)."""
        with self._lock:
            pending = self._pending.pop(request_id, None)
            if pending is not None and not self._closed:
                self._client.send(AbortRequest(request_id))
        if pending is not None and self.metrics is not None:
            self.metrics.on_finished("abort", None)

    # ANCHOR_END: abort

    def finish(self, request_id: str) -> None:
        """End the request as finished normally ("stop"), at the core's next turn: its
        handler found a stop string in the text, which only the handler decodes."""
        with self._lock:
            if request_id in self._pending and not self._closed:
                self._client.send(FinishRequest(request_id))

    # -- what the client's thread calls --------------------------------------------------

    def _on_ready(self, info: EngineInfo) -> None:
        self.info = info
        if self.metrics is not None:
            self.metrics.on_engine_ready(info)
        where = "in a process of its own" if self.multiprocess else "in a thread"
        logger.info("engine ready after a warm-up of %.1f s (%s)", info.warmup_seconds, where)
        self._ready.set()

    # ANCHOR: on_outputs
    def _on_outputs(self, turn: EngineCoreOutputs) -> None:
        """Route a turn's outputs to their requests' queues, one call per event loop."""
        now = time.monotonic()
        routed: list[tuple[_Pending, EngineCoreOutput]] = []
        with self._lock:
            for output in turn.outputs:
                pending = self._pending.get(output.request_id)
                if pending is None:  # aborted since: nobody listens
                    continue
                if output.finish_reason is not None:
                    del self._pending[output.request_id]
                routed.append((pending, output))
                if self.metrics is not None:
                    self._record(pending, output, now)
        if self.metrics is not None and turn.stats is not None:
            self.metrics.record_step(turn.stats)
        _route(routed)

    # ANCHOR_END: on_outputs

    def _record(self, pending: _Pending, output: EngineCoreOutput, now: float) -> None:
        new = len(output.new_token_ids)
        if new:
            first = pending.last_token_time is None
            gap = now - (pending.arrival if first else pending.last_token_time)
            self.metrics.on_tokens(pending.num_prompt_tokens, new, first, gap)
            pending.last_token_time = now
        if output.finish_reason is not None and output.status_code != 503:
            self.metrics.on_finished(output.finish_reason, now - pending.arrival)

    def _on_dead(self, error: BaseException, started: bool) -> None:
        """The core stopped: fail every request still pending, refuse new ones."""
        first = not self._done.is_set()
        self._done.set()
        if not started and first:
            logger.error("the engine failed to start: %s", error)
            self.startup_error = error
            message, status = f"the engine failed to start: {error}", 503
        elif isinstance(error, ShuttingDown):
            message, status = "the server is shutting down; send the request again later", 503
        else:
            if first:
                logger.error("the engine core stopped: %s", error)
                self.engine_error = error
            message = f"the engine stopped ({error}); this request was lost: restart the server"
            status = 500
        with self._lock:
            self._closed = True
            lost, self._pending = self._pending, {}
        _route([(p, RequestOutputDelta(r, [], "error", message, status)) for r, p in lost.items()])
        if self.metrics is not None and status == 500:
            for _ in lost:
                self.metrics.on_finished("error", None)
        self._ready.set()
        if not started and first and self._on_startup_failure is not None:
            self._on_startup_failure(error)
