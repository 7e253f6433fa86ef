"""Who the ranks are: the process group of tensor parallelism, and its all-reduce op.

vLLM counterpart: vllm/distributed/parallel_state.py (`init_distributed_environment`,
`initialize_model_parallel`, `GroupCoordinator` with a device group and a CPU group,
`get_tp_group`, `patch_tensor_parallel_group`, and the `torch.ops.vllm.all_reduce` op
registered with `direct_register_custom_op`). mini_vllm has one kind of parallelism, on
one machine, so the tensor-parallel group is every rank there is.

A process that never initialises anything is one rank of one: `get_tp_group()` answers
with a group of size 1 whose collectives return their input, and no process group exists.
That is the single-process engine, which pays nothing for any of this.

Why a custom op: `torch.ops.mini_vllm.all_reduce(x, group_name)` is one node that Dynamo
and a graph keep as it is (out of place; the group passed by name, since a process group
is not a value a schema can carry). Its fake implementation gives the shape alone, so a
trace never runs a collective.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from mini_vllm.torch_utils import direct_register_custom_op

__all__ = [
    "GroupCoordinator",
    "destroy_distributed_environment",
    "get_tensor_model_parallel_rank",
    "get_tensor_model_parallel_world_size",
    "get_tp_group",
    "init_distributed_environment",
    "initialize_model_parallel",
    "model_parallel_is_initialized",
    "patch_tensor_parallel_group",
    "rank_backend",
    "rank_device",
]


# ANCHOR: group_coordinator
@dataclass
class GroupCoordinator:
    """One parallel group as this rank sees it (vLLM: `GroupCoordinator`).

    `device_group` carries the model's tensors (NCCL on CUDA, gloo on the CPU);
    `cpu_group` (always gloo) carries host values such as the KV block count.
    """

    unique_name: str
    world_size: int
    rank_in_group: int
    device_group: dist.ProcessGroup | None = None
    cpu_group: dist.ProcessGroup | None = None

    @classmethod
    def single(cls) -> GroupCoordinator:
        """A group of one rank: every collective is the identity."""
        return cls("tp:single", 1, 0)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over the ranks, out of place."""
        if self.world_size == 1:
            return x
        return torch.ops.mini_vllm.all_reduce(x, self.unique_name)

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's `x`, concatenated along `dim` in rank order."""
        if self.world_size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        # The list form: gloo has no all_gather_into_tensor on every torch version.
        dist.all_gather(parts, x.contiguous(), group=self.device_group)
        return torch.cat(parts, dim=dim)

    # ANCHOR_END: group_coordinator
    # ANCHOR: agreement_checks
    def all_reduce_min(self, value: int) -> int:
        """The smallest of the ranks' `value` (an int on the host), over the CPU group."""
        if self.world_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.long)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return int(t.item())

    def check_same(self, what: str, value: object) -> None:
        """Raise on every rank unless every rank holds the same `value` (a picklable host
        value, such as the list of graphs a rank is about to capture), naming who differs.

        Used where the ranks must agree before a collective depends on it: a rank that
        captured other graphs would, some later step, replay a graph whose collectives the
        others never launch, and wait for them forever."""
        if self.world_size == 1:
            return
        values: list[object] = [None] * self.world_size
        dist.all_gather_object(values, value, group=self.cpu_group)
        differ = [rank for rank, v in enumerate(values) if v != values[0]]
        if differ:
            raise RuntimeError(
                f"the ranks disagree on {what}: rank 0 has {_short(values[0])}, rank "
                f"{differ[0]} has {_short(values[differ[0]])}. Every rank must be built from "
                "the same configuration (the same engine arguments on every rank)"
            )


# ANCHOR_END: agreement_checks


def _short(value: object, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# How long the ranks may take to meet (each process starts Python and imports torch first).
RENDEZVOUS_TIMEOUT_S = 300.0
_SINGLE = GroupCoordinator.single()
_TP: GroupCoordinator | None = None
# The groups the all-reduce op finds by name (vLLM keeps the same table, `_groups`).
_groups: dict[str, GroupCoordinator] = {}


# ANCHOR: all_reduce_op
def _all_reduce(tensor: torch.Tensor, group_name: str) -> torch.Tensor:
    group = _groups[group_name]
    out = tensor.clone()  # out of place: an op's output never shares its input's storage
    dist.all_reduce(out, group=group.device_group)
    return out


def _all_reduce_fake(tensor: torch.Tensor, group_name: str) -> torch.Tensor:
    return torch.empty_like(tensor)


direct_register_custom_op("all_reduce", _all_reduce, fake_impl=_all_reduce_fake)
# ANCHOR_END: all_reduce_op


def get_tp_group() -> GroupCoordinator:
    """This rank's tensor-parallel group; a group of one unless `initialize_model_parallel` ran."""
    return _TP if _TP is not None else _SINGLE


def get_tensor_model_parallel_world_size() -> int:
    return get_tp_group().world_size


def get_tensor_model_parallel_rank() -> int:
    return get_tp_group().rank_in_group


def model_parallel_is_initialized() -> bool:
    return _TP is not None


def rank_device(device: str, rank: int) -> str:
    """The device of the rank with this index on its machine: the CPU for every rank, or
    that GPU."""
    return "cpu" if device == "cpu" else f"cuda:{rank}"


def rank_backend(device: str) -> str:
    """The collectives' backend for the device: gloo between CPU processes, NCCL on GPUs."""
    return "gloo" if device == "cpu" else "nccl"


# ANCHOR: init_distributed
def init_distributed_environment(
    world_size: int,
    rank: int,
    distributed_init_method: str,
    backend: str,
    timeout_s: float,
) -> None:
    """Join the process group of `world_size` ranks (every rank calls this, each with its own
    `rank`). `timeout_s` bounds every collective: a rank that is gone or on another step
    turns into an error on the others after that long, never a hang. Meeting the other
    ranks may take longer (each starts a Python and imports torch first): with a
    `tcp://host:port` or a `file://path` method the rendezvous waits up to
    `RENDEZVOUS_TIMEOUT_S`."""
    if dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is already initialised in this process: one tensor-parallel "
            "engine a process (delete the other LLM first)"
        )
    if backend == "nccl":
        # A collective that fails or times out must not kill this process from NCCL's
        # watchdog thread (its default): the executor sees the dead or silent rank and
        # turns it into an error the engine's caller can catch.
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
    options = dict(init_method=distributed_init_method)
    meeting = datetime.timedelta(seconds=max(timeout_s, RENDEZVOUS_TIMEOUT_S))
    if distributed_init_method.startswith("tcp://"):
        host, port = distributed_init_method.removeprefix("tcp://").rsplit(":", 1)
        store = dist.TCPStore(host, int(port), world_size, is_master=rank == 0, timeout=meeting)
        options = dict(store=store)
    elif distributed_init_method.startswith("file://"):
        store = dist.FileStore(distributed_init_method.removeprefix("file://"), world_size)
        store.set_timeout(meeting)
        options = dict(store=store)
    dist.init_process_group(
        backend=backend,
        world_size=world_size,
        rank=rank,
        timeout=datetime.timedelta(seconds=timeout_s),
        **options,
    )


def initialize_model_parallel(tensor_model_parallel_size: int) -> None:
    """Make every rank of the process group one tensor-parallel group."""
    global _TP
    world_size = dist.get_world_size()
    if tensor_model_parallel_size != world_size:
        raise RuntimeError(
            f"tensor_parallel_size={tensor_model_parallel_size} but the process group has "
            f"{world_size} ranks: mini_vllm runs tensor parallelism alone, over every rank"
        )
    device_group = dist.group.WORLD
    cpu_group = device_group
    if dist.get_backend(device_group) != "gloo":
        cpu_group = dist.new_group(backend="gloo")
    _TP = GroupCoordinator("tp", world_size, dist.get_rank(), device_group, cpu_group)
    _groups[_TP.unique_name] = _TP


# ANCHOR_END: init_distributed


def destroy_distributed_environment() -> None:
    """Leave the process group (a later engine in this process may create another).

    NCCL's communicators are aborted, not destroyed: a polite destroy waits for the peers,
    which may be gone (a rank that died, or one already killed at shutdown), and for
    kernels that may still wait on them; with graphs that captured its collectives alive,
    it can wait for ever. Aborting ends them at once, and nothing is left to save."""
    global _TP
    if _TP is not None:
        _groups.pop(_TP.unique_name, None)
        _TP = None
    if not dist.is_initialized():
        return
    if dist.get_backend() == "nccl":
        try:
            dist.distributed_c10d._abort_process_group()
            return
        except Exception:  # an older torch without it: destroy, as below
            pass
    dist.destroy_process_group()


@contextlib.contextmanager
def patch_tensor_parallel_group(group: GroupCoordinator) -> Iterator[None]:
    """Build (or run) under another tensor-parallel group, e.g. a whole, unsharded model
    inside a rank (vLLM uses the same patch for a draft model of another width)."""
    global _TP
    previous = _TP
    _TP = group
    try:
        yield
    finally:
        _TP = previous
