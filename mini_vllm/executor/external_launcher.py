"""Tensor parallelism under torchrun: every process is one rank and runs the whole engine.

vLLM counterpart: vllm/v1/executor/uniproc_executor.py (`ExecutorWithExternalLauncher`,
chosen with `distributed_executor_backend="external_launcher"`): the processes are started
by a launcher (torchrun, a cluster's job script), which also tells each its rank through
the environment (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`). There
is no driver: each process builds an `LLM`, with its own scheduler, and runs the same
script on the same prompts. This is SPMD (one program, many data... here, many shards),
the way training jobs run, and it reaches several machines through torchrun's own
rendezvous (`torchrun --nnodes 2 --nproc-per-node 8 ...`).

What keeps the ranks in step, where the one-machine executor has a single scheduler:
- every rank gets the same requests in the same order (the user's script), so every
  scheduler makes the same decisions: the engine is deterministic given its inputs;
- every rank samples, from the same logits (each rank gathers the whole vocabulary's)
  with the same generators, so the requests grow identically everywhere, log-probabilities
  included;
- each step the ranks compare two fingerprints, each with one tiny collective: of what they
  scheduled, before the forward (a rank whose script diverged is an error that says so,
  where it would otherwise enter the forward with other shapes and hang, or compute
  garbage), and of what they sampled, after it (a rank whose random state drifted).

Failure rules: as the one-machine executor's, every collective times out after
`MINI_VLLM_TP_TIMEOUT_S`; a rank that died or diverged is then an error on the others.
"""

from __future__ import annotations

import os
import weakref
import zlib

import torch
import torch.distributed as dist

from mini_vllm import envs
from mini_vllm.distributed.parallel_state import (
    destroy_distributed_environment,
    get_tp_group,
    init_distributed_environment,
    initialize_model_parallel,
    rank_backend,
    rank_device,
)
from mini_vllm.errors import UserError

__all__ = ["ExternalLauncherExecutor", "launcher_env", "schedule_fingerprint"]

_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def launcher_env(tensor_parallel_size: int) -> tuple[int, int, int]:
    """(rank, local rank, processes on this machine) from a launcher's environment, or a
    UserError that says how to launch."""
    missing = [name for name in _LAUNCHER_VARS if name not in os.environ]
    if missing:
        raise UserError(
            "distributed_executor_backend='external_launcher' runs one rank a process, "
            f"started by a launcher that sets {', '.join(missing)}: run the script with "
            f"torchrun --nproc-per-node {tensor_parallel_size} SCRIPT (or, without a "
            "launcher, leave distributed_executor_backend unset: the engine starts its ranks)"
        )
    world_size = int(os.environ["WORLD_SIZE"])
    if world_size != tensor_parallel_size:
        raise UserError(
            f"the launcher started {world_size} processes but tensor_parallel_size is "
            f"{tensor_parallel_size}: mini_vllm runs tensor parallelism alone, one rank a "
            "process, so the two must be equal"
        )
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    return int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), local_world


# ANCHOR: fingerprint
def schedule_fingerprint(output) -> int:
    """A number that differs (almost surely) when two ranks scheduled different steps: each
    row's id, new-token count, cached tokens and new token ids, in row order. The ids count:
    prompts that differ in their tokens alone give rows of the same shapes, whose forward
    would mix the two prompts on every rank with no collective failing."""
    rows = [
        (s.seq_id, s.num_new_tokens, s.num_computed_tokens, s.new_token_ids)
        for s in output.scheduled
    ]
    return zlib.crc32(repr(rows).encode())


# ANCHOR_END: fingerprint


def _leave_group(runner_holder: list) -> None:
    """Leave the process group, this rank's graphs first (they hold its collectives)."""
    if runner_holder:
        runner_holder[0].release_graphs()
    destroy_distributed_environment()


class ExternalLauncherExecutor:
    """This process's rank in a group a launcher started; `execute_model` runs its shard of
    the step, checked against the other ranks."""

    def __init__(self, config) -> None:
        self.world_size = config.tensor_parallel_size
        self.timeout_s = envs.MINI_VLLM_TP_TIMEOUT_S
        self.seed = config.seed
        self.rank, self.local_rank, local_world = launcher_env(self.world_size)
        self.device = rank_device(config.device, self.local_rank)
        if config.device == "cpu":  # the ranks of this machine share its cores
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
        else:
            torch.cuda.set_device(self.device)
        init_distributed_environment(
            self.world_size, self.rank, "env://", rank_backend(config.device), self.timeout_s
        )
        initialize_model_parallel(self.world_size)
        # Leave the process group when this object goes, or at the latest at exit: a gloo or
        # NCCL group still alive while the interpreter tears down aborts the process
        # ("terminate called without an active exception"), which a launcher reports as a
        # failed rank and answers by killing the others.
        self._runner_holder: list = []  # this rank's ModelRunner, once the engine made it
        self._finalizer = weakref.finalize(self, _leave_group, self._runner_holder)
        self._failure: str | None = None

    @property
    def _runner(self):
        return self._runner_holder[0] if self._runner_holder else None

    @property
    def driver_runner(self):
        """This rank's ModelRunner (set by the engine); it samples, as every rank does."""
        return self._runner

    @driver_runner.setter
    def driver_runner(self, runner) -> None:
        runner.every_rank_samples = True
        self._runner_holder[:] = [runner]
        # The draws of unseeded requests come from the process's generator: the same seed on
        # every rank, set once the model is built, makes them the same (vLLM's workers call
        # `set_random_seed` with the model's seed).
        torch.manual_seed(self.seed)

    # ANCHOR: execute_model
    def execute_model(self, output):
        """Check that every rank scheduled this step, run this rank's shard and sample, and
        check that every rank sampled the same tokens."""
        if self._failure is not None:
            raise RuntimeError(self._failure)
        try:
            if not self._agree(schedule_fingerprint(output)):
                rows = [(s.seq_id, s.num_new_tokens) for s in output.scheduled][:8]
                self._fail(
                    f"rank {self.rank} scheduled another step than some other rank (its rows: "
                    f"{rows}): every rank must get the same requests, in the same order"
                )
            sampled = self._runner.execute_model(output)
            if not self._agree(zlib.crc32(repr(sampled).encode())):
                self._fail(
                    f"rank {self.rank} sampled other tokens than some other rank ({sampled[:8]}):"
                    " every rank must seed its engine alike (the same seed, the same requests)"
                )
            return sampled
        except RuntimeError as exc:
            if self._failure is not None:
                raise
            self._fail(
                f"rank {self.rank}: a collective failed ({exc}); a rank died, or its script "
                f"went another way (collectives wait {self.timeout_s:g} s: "
                "MINI_VLLM_TP_TIMEOUT_S)",
                exc,
            )

    # ANCHOR_END: execute_model

    # ANCHOR: agree
    def _agree(self, value: int) -> bool:
        """Whether every rank holds the same `value`: the largest equals the smallest."""
        bounds = torch.tensor([value, -value], dtype=torch.long)
        dist.all_reduce(bounds, op=dist.ReduceOp.MAX, group=get_tp_group().cpu_group)
        return int(bounds[0]) == -int(bounds[1])

    # ANCHOR_END: agree

    def _fail(self, what: str, cause: BaseException | None = None):
        self._failure = (
            f"tensor parallelism under a launcher: {what}. The ranks no longer run in step, "
            "so this engine cannot go on"
        )
        raise RuntimeError(self._failure) from cause

    def wait_for_workers_loaded(self) -> None:
        """Every rank loads its own shard in its own process: nothing to wait for."""

    @property
    def failed(self) -> bool:
        return self._failure is not None

    def shutdown(self) -> None:
        self._finalizer()
