"""Where the engine core runs: a thread of the server's process, or a process of its own.

vLLM counterpart: vllm/v1/engine/core_client.py (`EngineCoreClient.make_client`,
`InprocClient`, and `AsyncMPClient`, which starts `EngineCoreProc` and talks to it over
ZeroMQ sockets) and vllm/v1/engine/core.py (`EngineCoreProc.run_engine_core`). vLLM runs the
core in its own process unless `VLLM_ENABLE_V1_MULTIPROCESSING=0`.

Why a process: Python lets one thread at a time run Python code (the interpreter lock, the
GIL). In one process, the server's event loop (parsing requests, rendering prompts, writing
thousands of streamed chunks a second) and the engine's loop take turns, and every time a
step hands the lock over (each PyTorch call does) it may wait up to the interpreter's switch
interval for it back. Under load a step of a few milliseconds then takes tens. In a process
of its own the core has an interpreter to itself; the two sides exchange small messages.

Both clients take the same calls and report through the same three callbacks:

- `on_ready(info)` once the warm-up is over (`EngineInfo`: what the server checks requests
  against);
- `on_outputs(outputs)` once a turn (`EngineCoreOutputs`), from a thread of the client;
- `on_dead(error, started)` when the core cannot go on: it failed to start (`started` false)
  or died (a process killed, a loop that raised); every request still held is lost.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import pickle
import queue
import tempfile
import threading
import time
from collections.abc import Callable

from mini_vllm.engine.core import EngineCore, EngineCoreOutputs, EngineInfo
from mini_vllm.errors import UserError
from mini_vllm.utils import cpu_threads_context

__all__ = ["EngineCoreClient", "InprocClient", "MPClient", "ShuttingDown", "make_client"]

logger = logging.getLogger(__name__)


class ShuttingDown(Exception):
    """What `on_dead` gets when the core stopped because it was asked to."""


OnReady = Callable[[EngineInfo], None]
OnOutputs = Callable[[EngineCoreOutputs], None]
OnDead = Callable[[BaseException, bool], None]

_STOP = "stop"
# How often a side waiting on the other checks that it is still there (seconds).
_LIVENESS_PERIOD_S = 0.5


class EngineCoreClient:
    """What the server calls: start the core, send it commands, stop it."""

    def start(self, on_ready: OnReady, on_outputs: OnOutputs, on_dead: OnDead) -> None:
        raise NotImplementedError

    def send(self, command) -> None:
        """Hand the core a command (thread-safe; it is applied at the core's next turn)."""
        raise NotImplementedError

    def shutdown(self, timeout: float) -> None:
        """Stop the core after the step in progress, and wait for it."""
        raise NotImplementedError

    @property
    def llm(self):
        """The `LLM`, where it lives in this process (a thread core), else None."""
        return None


def make_client(engine_factory: Callable[[], object], multiprocess: bool) -> EngineCoreClient:
    return MPClient(engine_factory) if multiprocess else InprocClient(engine_factory)


def _build(engine_factory: Callable[[], object]) -> tuple[object, EngineInfo]:
    """The warm-up: build the `LLM` (load, compile, capture), timed."""
    start = time.perf_counter()
    llm = engine_factory()
    return llm, EngineInfo.of(llm, time.perf_counter() - start)


# -- in a thread -----------------------------------------------------------------------


class InprocClient(EngineCoreClient):
    """The core's loop in a thread of this process; commands on an in-memory queue."""

    def __init__(self, engine_factory: Callable[[], object]) -> None:
        self._engine_factory = engine_factory
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._llm = None
        self._thread = threading.Thread(target=self._run, name="mini_vllm-engine", daemon=True)

    @property
    def llm(self):
        return self._llm

    def start(self, on_ready: OnReady, on_outputs: OnOutputs, on_dead: OnDead) -> None:
        self._callbacks = (on_ready, on_outputs, on_dead)
        self._thread.start()

    def send(self, command) -> None:
        self._commands.put(command)

    def shutdown(self, timeout: float) -> None:
        self._commands.put(_STOP)
        if self._thread.is_alive():
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.warning(
                    "the engine thread did not stop within %.0f s (still warming up?); it is a "
                    "daemon thread and ends with the process",
                    timeout,
                )

    def _next_commands(self, wait: bool) -> list | None:
        commands = []
        try:
            commands.append(self._commands.get() if wait else self._commands.get_nowait())
            while True:
                commands.append(self._commands.get_nowait())
        except queue.Empty:
            pass
        return None if _STOP in commands else commands

    def _run(self) -> None:
        on_ready, on_outputs, on_dead = self._callbacks
        try:
            llm, info = _build(self._engine_factory)
        except BaseException as exc:  # reported to the server
            on_dead(exc, False)
            return
        self._llm = llm
        core = EngineCore(llm)
        on_ready(info)
        try:
            with cpu_threads_context(llm.engine.runner.device, llm.config.cpu_threads):
                core.run_busy_loop(self._next_commands, on_outputs)
        except BaseException as exc:
            logger.exception("the engine loop failed")
            on_dead(exc, True)
            return
        on_dead(ShuttingDown("the server is shutting down"), True)


# -- in a process of its own -----------------------------------------------------------


class MPClient(EngineCoreClient):
    """The core in a process of its own (started with spawn: safe with CUDA), two ZeroMQ
    sockets between them: commands in (PUSH to PULL), outputs out (PUSH to PULL)."""

    def __init__(self, engine_factory: Callable[[], object]) -> None:
        try:
            pickle.dumps(engine_factory)
        except Exception as exc:
            raise UserError(
                "an engine core in a process of its own is built there from its factory, "
                f"which must pickle (e.g. functools.partial(LLM, **kwargs)): {exc}"
            ) from None
        import zmq

        self._engine_factory = engine_factory
        self._context = zmq.Context()
        self._dir = tempfile.mkdtemp(prefix="mini_vllm-core-")
        self._input_path = f"ipc://{self._dir}/input"
        self._output_path = f"ipc://{self._dir}/output"
        self._input = self._context.socket(zmq.PUSH)
        self._input.bind(self._input_path)
        self._output = self._context.socket(zmq.PULL)
        self._output.bind(self._output_path)
        self._send_lock = threading.Lock()  # a ZeroMQ socket is not thread-safe
        self._stopping = False
        self._shutdown_lock = threading.Lock()
        self._shut_down = False
        self._proc = None
        self._thread = threading.Thread(
            target=self._receive, name="mini_vllm-core-output", daemon=True
        )

    def start(self, on_ready: OnReady, on_outputs: OnOutputs, on_dead: OnDead) -> None:
        self._callbacks = (on_ready, on_outputs, on_dead)
        spawn = multiprocessing.get_context("spawn")
        # Not a daemon: a daemon process may not start processes of its own, and the core
        # starts one a tensor-parallel rank. So this process ends it at exit instead (before
        # multiprocessing's own exit handler, which would wait for it).
        self._proc = spawn.Process(
            target=run_engine_core,
            args=(self._engine_factory, self._input_path, self._output_path, os.getpid()),
            name="mini_vllm-engine-core",
        )
        self._proc.start()
        atexit.register(_end_at_exit, self._proc)
        self._thread.start()

    def send(self, command) -> None:
        import zmq

        message = pickle.dumps(command, protocol=pickle.HIGHEST_PROTOCOL)
        with self._send_lock:
            while not self._input.closed:
                try:
                    self._input.send(message, zmq.NOBLOCK)
                    return
                except zmq.Again:  # the core is far behind, or gone
                    if self._proc is None or not self._proc.is_alive():
                        return  # nobody will ever read it
                    self._input.poll(100, zmq.POLLOUT)

    def shutdown(self, timeout: float) -> None:
        with self._shutdown_lock:  # the server may ask twice (its lifespan, its signal)
            if self._shut_down:
                return
            self._shut_down = True
            self._stopping = True
            if self._proc is not None and self._proc.is_alive():
                self.send(_STOP)
                self._proc.join(timeout)
                if self._proc.is_alive():
                    logger.warning("the engine core did not stop in %.0f s: ending it", timeout)
                    self._proc.terminate()
                    self._proc.join(5)
            if self._thread.is_alive():
                self._thread.join(timeout)
            with self._send_lock:
                self._input.close(linger=0)
            self._output.close(linger=0)
            self._context.term()
            for name in ("input", "output"):
                try:
                    os.unlink(os.path.join(self._dir, name))
                except FileNotFoundError:
                    pass
            if os.path.isdir(self._dir):
                os.rmdir(self._dir)

    @property
    def pid(self) -> int | None:
        """The engine core process's id (once started)."""
        return None if self._proc is None else self._proc.pid

    def _receive(self) -> None:
        """The output thread: the core's messages, in order, to the callbacks."""
        import zmq

        on_ready, on_outputs, on_dead = self._callbacks
        started = False
        while True:
            try:
                ready = self._output.poll(int(_LIVENESS_PERIOD_S * 1000))
            except zmq.ZMQError:  # closed by shutdown
                return
            if not ready:
                if self._proc.is_alive():
                    continue
                if self._output.poll(0):  # its last words came after the poll
                    continue
                if self._stopping:
                    on_dead(ShuttingDown("the server is shutting down"), True)
                else:
                    code = self._proc.exitcode
                    on_dead(
                        RuntimeError(f"the engine core process died (exit code {code})"), started
                    )
                return
            kind, payload = pickle.loads(self._output.recv())
            if kind == "outputs":
                on_outputs(payload)
            elif kind == "ready":
                started = True
                on_ready(payload)
            elif kind == "failed":  # (is a user error, message)
                user_error, message = payload
                on_dead(UserError(message) if user_error else RuntimeError(message), started)
                return
            elif kind == "stopped":
                on_dead(ShuttingDown("the server is shutting down"), True)
                return


def _end_at_exit(proc) -> None:
    """At this process's exit: the core, if still running, is ended (it holds the GPU)."""
    if proc.is_alive():
        proc.terminate()
        proc.join(5)
        if proc.is_alive():
            proc.kill()


# ANCHOR: run_engine_core
def run_engine_core(
    engine_factory: Callable[[], object], input_path: str, output_path: str, parent_pid: int
) -> None:
    """The engine core process: warm up, say so, then turn the loop until told to stop (or
    until the server's process is gone)."""
    import zmq

    context = zmq.Context()
    commands = context.socket(zmq.PULL)
    commands.connect(input_path)
    outputs = context.socket(zmq.PUSH)
    outputs.connect(output_path)

    def send(kind: str, payload) -> None:
        outputs.send(pickle.dumps((kind, payload), protocol=pickle.HIGHEST_PROTOCOL))

    def next_commands(wait: bool) -> list | None:
        received = []
        # The server died (its child is then adopted by another process): nobody reads the
        # outputs, and a send would block once the socket's queue is full.
        if os.getppid() != parent_pid:
            return None
        while wait and not commands.poll(int(_LIVENESS_PERIOD_S * 1000)):
            if os.getppid() != parent_pid:
                return None
        while True:
            try:
                received.append(pickle.loads(commands.recv(zmq.NOBLOCK)))
            except zmq.Again:
                break
        return None if _STOP in received else received

    try:
        try:
            llm, info = _build(engine_factory)
        except BaseException as exc:
            send("failed", (isinstance(exc, UserError), f"{exc}"))
            return
        send("ready", info)
        core = EngineCore(llm)
        with cpu_threads_context(llm.engine.runner.device, llm.config.cpu_threads):
            core.run_busy_loop(next_commands, lambda turn: send("outputs", turn))
        send("stopped", None)
    finally:
        commands.close(linger=0)
        outputs.close(linger=1000)  # let the last message out
        context.term()


# ANCHOR_END: run_engine_core
