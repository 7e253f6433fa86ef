"""The engine as an HTTP server sees it: one thread steps the engine, handlers await tokens.

vLLM counterpart: vllm/v1/engine/async_llm.py (`AsyncLLM.generate`, an async generator of
outputs per request; `AsyncLLM.abort`) with vllm/v1/engine/output_processor.py
(`RequestOutputCollector`, the per-request queue) and vllm/v1/engine/core.py (the busy loop
of `EngineCoreProc`). vLLM runs the engine core in another process and talks to it over
ZeroMQ; here it is a thread of the server's process, and the queues are in memory.

How it works:

- One thread, the engine thread, owns the `LLM` (its `LLMEngine` serves one caller at a
  time). It builds it first: load the weights, compile, capture every graph of the ladder.
  That is the warm-up; `is_ready` (and `/health`) turns true only after it.
- A handler calls `generate(...)`, an async generator. It puts an "add" command on the
  command queue and awaits its own `asyncio.Queue`. The engine thread takes the commands
  between two steps, steps the engine, and hands each request the tokens the step produced
  with `loop.call_soon_threadsafe(...)`, the only way another thread may touch an asyncio
  queue: one call a step for all the requests of an event loop, not one a request.
- A handler that stops listening (the client disconnected, or the handler was cancelled)
  closes the generator, whose `finally` sends an "abort" command: the engine ends the
  request and frees its KV blocks at the next turn of the loop.
- A step that raises fails every request the engine held when it began (an error delta,
  status 500); the engine has already taken the step back, so the loop goes on and the
  requests that come after are served.
- `shutdown()` stops the loop; requests still in the engine get an error delta (503).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from mini_vllm.engine.sequence import Sequence
from mini_vllm.entrypoints.metrics import PrometheusStatLogger
from mini_vllm.errors import UserError
from mini_vllm.llm import LLM
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.utils import cpu_threads_context

__all__ = ["AsyncLLM", "RequestOutputDelta"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RequestOutputDelta:
    """What one turn of the engine loop brought one request."""

    new_token_ids: list[int]
    finish_reason: str | None = None  # set on the request's last delta only
    error: str | None = None  # finish_reason "error": what went wrong
    status_code: int = 200  # finish_reason "error": the HTTP status it calls for
    # With SamplingParams.logprobs: one entry a new token, (token, logprob, rank,
    # [(alternative id, logprob), ...]) as `Sequence.token_logprobs` holds it.
    logprobs: list[tuple] | None = None
    # With SamplingParams.prompt_logprobs, once (in the first delta after the prompt was
    # computed): one entry a prompt token, None for the first.
    prompt_logprobs: list[tuple | None] | None = None


@dataclass
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop  # the handler's loop, and its queue for this request
    queue: asyncio.Queue
    arrival: float  # time.monotonic() when the HTTP request came in


def _put_all(items: list[tuple[asyncio.Queue, RequestOutputDelta]]) -> None:
    """Runs in the event loop: one turn of the engine loop's deltas into their queues."""
    for deltas, delta in items:
        deltas.put_nowait(delta)


@dataclass
class _Abort:
    request_id: str


@dataclass
class _Finish:
    """End a request as finished ("stop"): its handler saw a stop string in its text."""

    request_id: str


_STOP = object()


@dataclass
class _LiveRequest:
    """A request in the engine, as the engine thread tracks it."""

    add: _Add
    seq: Sequence
    num_sent: int = 0  # output tokens handed to the handler so far
    prompt_logprobs_sent: bool = False
    last_token_time: float | None = None


class AsyncLLM:
    """An `LLM` stepped by a background thread, with an async generator per request.

    `engine_factory` builds the `LLM` (in the engine thread: the warm-up); tests pass one
    that waits, to watch `/health` answer 503 during the warm-up.
    """

    def __init__(
        self,
        engine_factory: Callable[[], LLM],
        metrics: PrometheusStatLogger | None = None,
        on_startup_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._engine_factory = engine_factory
        self.metrics = metrics
        self._on_startup_failure = on_startup_failure
        self.llm: LLM | None = None
        self.startup_error: BaseException | None = None
        self.warmup_seconds: float | None = None
        self._ready = threading.Event()
        self._done = threading.Event()  # the engine thread has left its loop (or never got there)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        # Set, under the lock, once nobody takes commands any more: a request that comes
        # then is failed at once instead of waiting on a queue nobody reads.
        self._closed = False
        self._closing_lock = threading.Lock()
        self._live: dict[str, _LiveRequest] = {}  # the engine thread's alone
        # Deltas of this turn of the engine loop, by event loop: handed over in one call each
        # (one wake-up of the event loop a step, not one a request).
        self._outbox: dict[asyncio.AbstractEventLoop, list] = {}
        self._thread = threading.Thread(target=self._run, name="mini_vllm-engine", daemon=True)

    # -- life cycle ----------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    @property
    def is_ready(self) -> bool:
        """True once the warm-up is done and until shutdown."""
        return self._ready.is_set() and not self._done.is_set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until ready or failed; True when ready."""
        self._ready.wait(timeout)
        return self.is_ready

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the loop (after the step in progress) and wait for the thread."""
        self._commands.put(_STOP)
        if self._thread.is_alive():
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.warning(
                    "the engine thread did not stop within %.0f s (still warming up?); it is a "
                    "daemon thread and ends with the process",
                    timeout,
                )

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
        loop = asyncio.get_running_loop()
        deltas: asyncio.Queue[RequestOutputDelta] = asyncio.Queue()
        arrival = time.monotonic() if arrival is None else arrival
        with self._closing_lock:
            closed = self._closed
            if not closed:
                add = _Add(request_id, list(prompt_token_ids), params, loop, deltas, arrival)
                self._commands.put(add)
        if closed:
            why = self.startup_error or "the server is shutting down"
            yield RequestOutputDelta([], "error", f"no engine to serve it: {why}", 503)
            return
        finished = False
        try:
            while not finished:
                delta = await deltas.get()
                # Behind (the client reads slower than the engine steps)? Take every delta
                # waiting as one: fewer, larger chunks, as vLLM's RequestOutputCollector.
                while delta.finish_reason is None and not deltas.empty():
                    later = deltas.get_nowait()
                    tokens = delta.new_token_ids + later.new_token_ids
                    logprobs = None
                    if delta.logprobs is not None or later.logprobs is not None:
                        logprobs = (delta.logprobs or []) + (later.logprobs or [])
                    delta = RequestOutputDelta(
                        tokens,
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

    def abort(self, request_id: str) -> None:
        """End the request and free its blocks (at the next turn of the engine loop)."""
        self._commands.put(_Abort(request_id))

    def finish(self, request_id: str) -> None:
        """End the request as finished normally ("stop"), at the next turn of the engine
        loop: its handler found a stop string in the text, which only the handler decodes
        (vLLM's output processor stops a request in the engine core the same way)."""
        self._commands.put(_Finish(request_id))

    # -- the engine thread ---------------------------------------------------------------

    # ANCHOR: warmup
    def _run(self) -> None:
        start = time.perf_counter()
        try:
            llm = self._engine_factory()
        except BaseException as exc:  # reported to the handlers, and to the server
            logger.error("the engine failed to start: %s", exc)
            self.startup_error = exc
            self._done.set()
            self._ready.set()
            self._drain_after_stop(f"the engine failed to start: {exc}")
            if self._on_startup_failure is not None:
                self._on_startup_failure(exc)
            return
        self.warmup_seconds = time.perf_counter() - start
        # A server runs for days: count the steps, keep no record of each.
        llm.engine.stats.keep_step_records = False
        self.llm = llm
        if self.metrics is not None:
            self.metrics.on_engine_ready(llm, self.warmup_seconds)
        logger.info("engine ready after a warm-up of %.1f s", self.warmup_seconds)
        self._ready.set()
        try:
            with cpu_threads_context(llm.engine.runner.device, llm.config.cpu_threads):
                self._loop(llm)
        finally:
            self._done.set()
            self._drain_after_stop("the server is shutting down; send the request again later")

    # ANCHOR_END: warmup

    # ANCHOR: engine_loop
    def _loop(self, llm: LLM) -> None:
        engine = llm.engine
        while True:
            idle = not engine.has_unfinished_requests()
            if not self._take_commands(engine, wait=idle):
                return
            if engine.has_unfinished_requests():
                self._step(llm)
            self._flush()

    def _send(self, add: _Add, delta: RequestOutputDelta) -> None:
        self._outbox.setdefault(add.loop, []).append((add.queue, delta))

    def _flush(self) -> None:
        """Hand this turn's deltas to their event loops, one call (one wake-up) per loop."""
        outbox, self._outbox = self._outbox, {}
        for loop, items in outbox.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # that event loop is closed: nobody listens any more
                pass

    # ANCHOR_END: engine_loop

    def _take_commands(self, engine, wait: bool) -> bool:
        """Apply every queued command (waiting for one when the engine is idle); False: stop."""
        try:
            command = self._commands.get() if wait else self._commands.get_nowait()
        except queue.Empty:
            return True
        while True:
            if command is _STOP:
                return False
            if isinstance(command, _Add):
                self._add(engine, command)
            elif isinstance(command, _Finish):
                live = self._live.get(command.request_id)
                if live is not None and not live.seq.is_finished:
                    engine.stop_request(live.seq.seq_id)
                    # Its last delta goes out now: with no other request the engine may not
                    # step again, and nothing else would hand it out.
                    self._hand_out_tokens(time.monotonic())
            else:
                self._abort(engine, command.request_id)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _add(self, engine, add: _Add) -> None:
        if add.request_id in self._live:  # its deltas would go to two queues, its abort to both
            self._send(
                add,
                RequestOutputDelta(
                    [],
                    "error",
                    f"request id {add.request_id!r} belongs to a request still running; "
                    "give each request its own id",
                    400,
                ),
            )
            return
        try:
            seq = engine.add_request(add.prompt_token_ids, add.params)
        except UserError as exc:  # the handlers check first; this is the last line
            self._send(add, RequestOutputDelta([], "error", str(exc), 400))
            return
        self._live[add.request_id] = _LiveRequest(add, seq)

    # ANCHOR: abort
    def _abort(self, engine, request_id: str) -> None:
        live = self._live.pop(request_id, None)
        if live is None:  # finished already, or never added
            return
        engine.abort_request(live.seq.seq_id)
        if self.metrics is not None:
            self.metrics.on_finished("abort", None)
        logger.info("request %s aborted (its client went away); its blocks are free", request_id)

    # ANCHOR_END: abort

    def _step(self, llm: LLM) -> None:
        engine = llm.engine
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
                self._live.pop(live.add.request_id, None)
                self._send(live.add, RequestOutputDelta([], "error", message, 500))
                if self.metrics is not None:
                    self.metrics.on_finished("error", None)
            if self.metrics is not None:
                self.metrics.record_step(llm)
            return
        self._hand_out_tokens(time.monotonic())
        if self.metrics is not None:
            self.metrics.record_step(llm)

    # ANCHOR: hand_out_tokens
    def _hand_out_tokens(self, now: float) -> None:
        for request_id, live in list(self._live.items()):
            seq = live.seq
            # Async scheduling holds the tokens still on the device as placeholders.
            ready = seq.num_output_tokens - seq.num_output_placeholders
            start = seq.num_prompt_tokens + live.num_sent
            new = seq.tokens(start, seq.num_prompt_tokens + ready) if ready > live.num_sent else []
            if not new and not seq.is_finished:
                continue
            logprobs, prompt_logprobs = self._logprobs_of(live, len(new))
            if new and self.metrics is not None:
                first = live.last_token_time is None
                gap = now - (live.add.arrival if first else live.last_token_time)
                self.metrics.on_tokens(seq.num_prompt_tokens, len(new), first, gap)
            if new:
                live.num_sent += len(new)
                live.last_token_time = now
            if not seq.is_finished:
                self._send(
                    live.add, RequestOutputDelta(new, None, None, 200, logprobs, prompt_logprobs)
                )
                continue
            del self._live[request_id]
            reason = seq.finish_reason.value
            if reason == "error":  # a request the engine can never serve (the handlers check)
                self._send(live.add, RequestOutputDelta(new, "error", seq.error, 400))
            else:
                self._send(
                    live.add, RequestOutputDelta(new, reason, None, 200, logprobs, prompt_logprobs)
                )
            if self.metrics is not None:
                self.metrics.on_finished(reason, now - live.add.arrival)

    # ANCHOR_END: hand_out_tokens

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

    def _drain_after_stop(self, message: str) -> None:
        """Fail what is still in the engine or on the queue: nobody will step them now."""
        for live in self._live.values():
            self._send(live.add, RequestOutputDelta([], "error", message, 503))
        self._live.clear()
        with self._closing_lock:
            self._closed = True
            while True:
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    break
                if isinstance(command, _Add):
                    self._send(command, RequestOutputDelta([], "error", message, 503))
        self._flush()
