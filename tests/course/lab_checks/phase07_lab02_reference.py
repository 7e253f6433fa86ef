"""The reference of labs/phase-07/lab-02-agreement, what its tests run with `--impl=ref`.

The engine keeps these checks on its own objects: `GroupCoordinator.check_same` and
`GroupCoordinator.all_reduce_min` (mini_vllm/distributed/parallel_state.py), and
`schedule_fingerprint` and `ExternalLauncherExecutor._agree`
(mini_vllm/executor/external_launcher.py). The lab asks for them as functions of a
`TPGroup`, so the functions below hand the group to the engine's own code: the lab's
tests, and the mistakes planted for them (phase07_lab02.py), run the engine's checks.

Step 4 has no counterpart in the engine, whose dispatch reads nothing a rank decides
alone (the chapter's rule 5); `dispatch_together` is written here, after vLLM's
`coordinate_batch_across_dp`, which makes data-parallel replicas take the smallest graph
mode any of them can run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from mini_vllm.config.compilation import CUDAGraphMode
from mini_vllm.distributed.parallel_state import GroupCoordinator, patch_tensor_parallel_group
from mini_vllm.engine.cudagraph_dispatcher import CudagraphDispatcher
from mini_vllm.executor import external_launcher
from mini_vllm.forward_context import BatchDescriptor


@dataclass(frozen=True)
class TPGroup:
    """The tensor-parallel group as one rank sees it: the part of the engine's
    GroupCoordinator that carries host values."""

    world_size: int
    rank_in_group: int
    cpu_group: dist.ProcessGroup | None = None

    @classmethod
    def single(cls) -> TPGroup:
        """A group of one rank, with no process group behind it."""
        return cls(1, 0, None)


def _coordinator(group: TPGroup) -> GroupCoordinator:
    return GroupCoordinator(
        "tp:lab02", group.world_size, group.rank_in_group, None, group.cpu_group
    )


# -- step 1 --------------------------------------------------------------------------------


def check_same(group: TPGroup, what: str, value: object) -> None:
    _coordinator(group).check_same(what, value)


# -- step 2 --------------------------------------------------------------------------------


def agreed_min(group: TPGroup, value: int) -> int:
    return _coordinator(group).all_reduce_min(value)


# -- step 3 --------------------------------------------------------------------------------


def schedule_fingerprint(output) -> int:
    return external_launcher.schedule_fingerprint(output)


def agree(group: TPGroup, value: int) -> bool:
    # The executor's check reads the group from get_tp_group() and nothing from itself.
    with patch_tensor_parallel_group(_coordinator(group)):
        return external_launcher.ExternalLauncherExecutor._agree(None, value)


# -- step 4 --------------------------------------------------------------------------------


def dispatch_together(
    group: TPGroup,
    dispatcher: CudagraphDispatcher,
    num_tokens: int,
    uniform_decode: bool,
    full_ok: bool,
) -> tuple[CUDAGraphMode, BatchDescriptor]:
    # One collective on every rank, whatever its own flag: the smallest flag wins, so a
    # rank that cannot run a FULL graph keeps every rank off it.
    everyone_ok = agreed_min(group, int(full_ok)) == 1
    return dispatcher.dispatch(num_tokens, uniform_decode, disable_full=not everyone_ok)
