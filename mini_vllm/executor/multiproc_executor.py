"""Tensor parallelism on one machine: one process a rank, each step's call sent to every one.

vLLM counterpart: vllm/v1/executor/multiproc_executor.py (`MultiprocExecutor`, `WorkerProc`:
one process per rank, a shared-memory broadcast queue carries each step's call, only rank
0's output is read, a monitor ends everything when a worker dies). The shape here is
nano-vllm's (nanovllm/engine/llm_engine.py and model_runner.py): ranks 1..N-1 are spawned
with `mp.get_context("spawn")`, rank 0 runs in the engine's own process next to the
scheduler, and each step rank 0 sends `(method, args)` to the workers and runs the same
method itself. nano-vllm writes the call into shared memory and sets an event per worker;
here each worker has a pipe, which costs a pickle a step but tells the driver at once
when the worker at its other end is gone, and carries a worker's error back.

What keeps the ranks in step:
- every rank runs the very same `SchedulerOutput`, one scheduler (rank 0's) made it;
- the KV cache has the same number of blocks on every rank: the minimum over the ranks
  (`LLMEngine`, vLLM's `get_kv_cache_configs`);
- only rank 0 samples, from logits every rank helped gather (`ModelRunner.execute_model`):
  the other ranks' random draws can then never disagree, and nothing is sent back.

Failure rules: every collective has a timeout (`MINI_VLLM_TP_TIMEOUT_S`, set when the
process group is made), so a rank that died or skipped a step is an error on the others,
never a hang. The driver turns it into one message that names the rank (its exit code, or
the traceback it sent), ends the workers, and refuses every later step: a tensor-parallel
engine whose ranks parted cannot go on. The workers end with the executor (the LLM deleted,
the process exiting) or when their pipe reports the driver gone.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import time
import traceback
import weakref
from dataclasses import dataclass, replace

import torch

from mini_vllm import envs
from mini_vllm.distributed.parallel_state import (
    RENDEZVOUS_TIMEOUT_S,
    destroy_distributed_environment,
    get_tp_group,
    init_distributed_environment,
    initialize_model_parallel,
    rank_backend,
    rank_device,
)

__all__ = ["MultiprocExecutor"]

_PIPE_CLOSED = "(its pipe closed)"
# How long a worker may take to leave after it was asked to, before it is killed.
SHUTDOWN_GRACE_S = 5.0
# How often rank 0, waiting for a step's tokens, looks whether the workers are alive.
WORKER_CHECK_S = 0.05


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class _Worker:
    rank: int
    process: mp.process.BaseProcess
    conn: mp.connection.Connection


# ANCHOR: worker_main
def _worker_main(rank: int, config, init_method: str, timeout_s: float, conn) -> None:
    """A worker process: join the group, load this rank's shard, then run what rank 0 sends."""
    from mini_vllm.engine.kv_cache_plan import device_memory, plan_kv_cache
    from mini_vllm.engine.model_runner import ModelRunner
    from mini_vllm.models.loader import load_model

    world_size = config.tensor_parallel_size
    runner = None
    try:
        conn.send(("started", None))  # rank 0 waits for this before it waits for the group
        device = rank_device(config.device, rank)
        if device == "cpu":  # the ranks share the cores
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        else:
            torch.cuda.set_device(device)
        init_distributed_environment(
            world_size, rank, init_method, rank_backend(config.device), timeout_s
        )
        initialize_model_parallel(world_size)
        model, _, _ = load_model(
            config.model, device, config.dtype, config.seed, False, config.custom_ops
        )
        conn.send(("loaded", None))
        weight = next(model.parameters())
        dev = weight.device
        plan = plan_kv_cache(config, model.config, weight.dtype, dev, **device_memory(dev))
        num_blocks = get_tp_group().all_reduce_min(plan.num_blocks)  # as rank 0 does
        runner = ModelRunner(model, config, plan.max_model_len, num_blocks)
        # What the engine does on rank 0, in the same order: the collectives of the
        # compile run and of each capture's warm-up meet their twins there.
        runner.compile_model()
        runner.capture_model(progress=False)
        while True:
            method, args = conn.recv()
            if method == "shutdown":
                break
            getattr(runner, method)(*args)
    except EOFError:
        parted = True  # the driver is gone: nothing left to serve
    except BaseException:
        parted = True
        try:
            conn.send(("error", traceback.format_exc()))
        except OSError:
            pass
        raise SystemExit(1) from None
    else:
        parted = False
    finally:
        _leave_group(runner, parted)


# ANCHOR_END: worker_main


def _leave_group(runner, parted: bool = False) -> None:
    """Leave the process group, this rank's graphs first (they hold its collectives); if
    the ranks `parted`, without waiting for this GPU."""
    if runner is not None:
        runner.release_graphs(wait=not parted)
    destroy_distributed_environment()


def _shutdown(workers: list[_Worker], driver: list, parted: list[bool]) -> None:
    """Ask every worker to leave, kill those that do not, and leave the process group."""
    for worker in workers:
        try:
            worker.conn.send(("shutdown", ()))
        except OSError:
            pass
    for worker in workers:
        worker.process.join(SHUTDOWN_GRACE_S)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(SHUTDOWN_GRACE_S)
        worker.conn.close()
    workers.clear()
    _leave_group(driver[0] if driver else None, parted[0])


class MultiprocExecutor:
    """Starts ranks 1..N-1 and makes this process rank 0; `execute_model` runs a step on all."""

    # ANCHOR: executor_init
    def __init__(self, config) -> None:
        self.world_size = config.tensor_parallel_size
        self.timeout_s = envs.MINI_VLLM_TP_TIMEOUT_S
        self.device = rank_device(config.device, 0)  # this process is rank 0
        self._failure: str | None = None
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        context = mp.get_context("spawn")  # CUDA cannot be used in a forked child
        self.workers: list[_Worker] = []
        # Whatever happens next, the workers go when this object does (or at exit).
        self._driver: list = []  # rank 0's ModelRunner, once the engine has made it
        self._parted = [False]  # set when the ranks fall out of step
        self._finalizer = weakref.finalize(
            self, _shutdown, self.workers, self._driver, self._parted
        )
        for rank in range(1, self.world_size):
            parent_end, child_end = context.Pipe()
            process = context.Process(
                target=_worker_main,
                args=(rank, config, init_method, self.timeout_s, child_end),
                name=f"mini_vllm-tp-rank{rank}",
                daemon=True,
            )
            process.start()
            child_end.close()
            self.workers.append(_Worker(rank, process, parent_end))
        # A worker that cannot even start (say, a script without `if __name__ ==
        # "__main__":`, which spawn re-imports) is an error now, not a rendezvous timeout.
        self._wait_for_workers("started", "starting", RENDEZVOUS_TIMEOUT_S)
        if config.device != "cpu":
            torch.cuda.set_device(rank_device(config.device, 0))
        init_distributed_environment(
            self.world_size, 0, init_method, rank_backend(config.device), self.timeout_s
        )
        initialize_model_parallel(self.world_size)

    # ANCHOR_END: executor_init

    def wait_for_workers_loaded(self, timeout_s: float = 600.0) -> None:
        """Wait until every worker holds its shard (loading may take longer than a step's
        collective may wait), or raise naming the rank that failed."""
        self._wait_for_workers("loaded", "loading the model", timeout_s)

    def _wait_for_workers(self, message: str, doing: str, timeout_s: float) -> None:
        """Wait until every worker has sent `message`, or raise naming the rank that died,
        failed or took longer than `timeout_s` while `doing` it."""
        pending = list(self.workers)
        deadline = time.monotonic() + timeout_s
        while pending:
            for worker in list(pending):
                if worker.conn.poll(0.05):
                    what, detail = self._receive(worker)
                    if what != message:
                        self._fail(f"rank {worker.rank} failed while {doing}:\n{detail}")
                    pending.remove(worker)
                elif not worker.process.is_alive():
                    self._fail(
                        f"rank {worker.rank} (pid {worker.process.pid}) exited with code "
                        f"{worker.process.exitcode} while {doing}"
                    )
            if pending and time.monotonic() > deadline:
                ranks = [w.rank for w in pending]
                self._fail(
                    f"rank(s) {ranks} took more than {timeout_s:.0f} s {doing}",
                    if_none_died="the machine may be overloaded",
                )

    @property
    def driver_runner(self):
        """Rank 0's ModelRunner (set by the engine)."""
        return self._driver[0] if self._driver else None

    @driver_runner.setter
    def driver_runner(self, runner) -> None:
        self._driver[:] = [runner]

    # ANCHOR: execute_model
    def execute_model(self, output):
        """Run one step on every rank; rank 0's sampled tokens."""
        if self._failure is not None:
            raise RuntimeError(self._failure)
        self._broadcast("execute_model", (output,))
        try:
            if self.device == "cpu":  # gloo's collectives time out by themselves
                return self.driver_runner.execute_model(output)
            # On GPUs a graph's all-reduce waits in a kernel, with no timeout: wait for the
            # step's tokens here instead, watching the workers (vLLM: the executor's monitor).
            start = time.perf_counter()
            runner = self.driver_runner
            step = runner.execute_model(output, non_blocking=True)
            self._wait_for_step(step)
            sampled = step.get()
            # The step's record counts until its tokens landed, as a blocking step's does.
            runner.last_step = replace(runner.last_step, seconds=time.perf_counter() - start)
            return sampled
        except Exception as exc:
            self._fail(f"rank 0 failed in a step ({type(exc).__name__}: {exc})", exc)

    def _wait_for_step(self, step) -> None:
        """Return once the step's tokens are on the host; raise if a worker died first or
        the step took longer than a collective may wait."""
        deadline = time.monotonic() + self.timeout_s
        next_check = time.monotonic() + WORKER_CHECK_S
        while not step.ready():
            now = time.monotonic()
            if now > next_check:
                dead = [w.rank for w in self.workers if not w.process.is_alive()]
                if dead or now > deadline:
                    what = f"rank {dead[0]} died" if dead else "the step never ended"
                    self._fail(f"rank 0 failed in a step ({what})")
                next_check = now + WORKER_CHECK_S

    # ANCHOR_END: execute_model

    def _broadcast(self, method: str, args: tuple) -> None:
        for worker in self.workers:
            try:
                worker.conn.send((method, args))
            except OSError as exc:
                self._fail(f"rank {worker.rank} cannot be reached ({exc})", exc)

    def _receive(self, worker: _Worker) -> tuple[str, object]:
        try:
            return worker.conn.recv()
        except (EOFError, OSError):
            return "error", _PIPE_CLOSED

    # ANCHOR: fail
    def _fail(self, what: str, cause: BaseException | None = None, if_none_died: str = ""):
        """Raise one error that says which rank parted and why; end the workers."""
        reasons = []
        for worker in self.workers:
            worker.process.join(0.5)  # a rank that crashed has an exit code by now
            # What it sent before it went (a closed pipe also polls as readable).
            said, detail = self._receive(worker) if worker.conn.poll(0) else ("", None)
            if said == "error" and detail != _PIPE_CLOSED:
                reasons.append(f"rank {worker.rank} raised:\n{str(detail).strip()}")
            elif not worker.process.is_alive():
                reasons.append(
                    f"rank {worker.rank} (pid {worker.process.pid}) died with exit code "
                    f"{worker.process.exitcode}"
                )
        if not reasons:
            reasons.append(
                f"no worker died: {if_none_died}"
                if if_none_died
                else "no worker died: the ranks disagree on the step (a collective some rank "
                f"did not join timed out after {self.timeout_s:g} s; MINI_VLLM_TP_TIMEOUT_S "
                "sets it)"
            )
        self._failure = (
            f"tensor parallelism: {what}; {'; '.join(reasons)}. The ranks no longer run in "
            "step, so this engine cannot go on: delete this LLM and build a new one"
        )
        self._parted[0] = True
        self.shutdown()
        raise RuntimeError(self._failure) from cause

    # ANCHOR_END: fail

    @property
    def failed(self) -> bool:
        """The ranks parted: every later step is refused."""
        return self._failure is not None

    def shutdown(self) -> None:
        """End the workers and leave the process group (also when this object is collected)."""
        self._finalizer()
