"""Phase 07, lab 02 — agreement: make the ranks agree, or stop every one of them with an error.

Tensor parallelism works only while every rank makes the same collectives, in the same
order, with the same shapes. A rank that decides something on its own (which graphs to
capture, how many KV blocks its memory holds, what it scheduled, whether it may replay a
FULL graph) can break that, and a broken meeting does not crash: it waits. The functions
here are the two remedies, once at start-up and again at every step:

                 check (stop with an error)           agree (make one value for all)
    start-up     check_same           (step 1)        agreed_min          (step 2)
    every step   schedule_fingerprint + agree (3)     dispatch_together   (step 4)

Every function takes this rank's `TPGroup` (given): how many ranks there are, which one
this is, and `cpu_group`, the gloo process group that carries host values between them
(pass it as `group=` to a `torch.distributed` collective). A group of one
(`TPGroup.single()`) has no process group behind it: the single-process engine never
makes one, and its checks must cost nothing there.

Given as well: the engine's `CudagraphDispatcher` (Phase 05's lab 03), `CUDAGraphMode` and
`BatchDescriptor`, which step 4 uses.

The tests run your functions on two, sometimes three, gloo ranks on the CPU: processes the
test starts, joined in one process group whose collectives give up after 10 s, so a rank
left waiting for a partner that went another way ends in an error, not a hang. Each test
says what every rank saw.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch  # noqa: F401  (yours to use)
import torch.distributed as dist

from mini_vllm.config.compilation import CUDAGraphMode
from mini_vllm.engine.cudagraph_dispatcher import CudagraphDispatcher
from mini_vllm.forward_context import BatchDescriptor

__all__ = [
    "BatchDescriptor",
    "CUDAGraphMode",
    "CudagraphDispatcher",
    "TPGroup",
    "agree",
    "agreed_min",
    "check_same",
    "dispatch_together",
    "schedule_fingerprint",
]


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


# -- step 1: a start-up check ---------------------------------------------------------------


def check_same(group: TPGroup, what: str, value: object) -> None:
    """Return when every rank holds an equal `value`; raise RuntimeError when they do not.

    `value` is a host value a rank built for itself and must share with the others: the
    graphs it is about to capture, a capture ladder, a dict of settings. It is any object
    that pickles and compares with `==`; values equal by `==` pass, however each rank
    built them.

    When the values are not all equal, the error's message says `what` disagrees and shows
    two ranks that hold different values, each as `rank R has VALUE`, with VALUE the value's
    repr cut to at most 200 characters, so that a ladder of 51 graphs still gives a message
    a person reads.

    Example, rank 0 holding [1, 2, 4, 8] and rank 1 holding [1, 2, 4]:
        check_same(group, "the capture ladder", ladder)
        RuntimeError: the ranks disagree on the capture ladder: rank 0 has [1, 2, 4, 8],
        rank 1 has [1, 2, 4]

    A group of one has nothing to compare: it returns without any collective.
    """
    raise NotImplementedError("TODO: step 1")


# -- step 2: a start-up agreement -----------------------------------------------------------


def agreed_min(group: TPGroup, value: int) -> int:
    """The smallest of the ranks' `value`, returned as the same Python int on every rank.

    For a count each rank measures alone, such as the KV blocks its free memory holds:
    block ids come from one block manager and every rank writes to them, so every rank
    must plan what the poorest rank can hold. Exact for any count a machine can have, a
    byte count past 2**53 included. A group of one returns `value` without a collective.

    Example: rank 0 passes 1000 and rank 1 passes 998: both get 998.
    """
    raise NotImplementedError("TODO: step 2")


# -- step 3: a check every step -------------------------------------------------------------


def schedule_fingerprint(output) -> int:
    """A number two ranks share when they scheduled the same step, and almost surely do not
    share when they scheduled different ones.

    `output.scheduled` holds the step's rows in batch order (a SchedulerOutput of Phase 03,
    or any object shaped like one). Each row has `seq_id` (a request id: an int or a
    str), `num_computed_tokens` (tokens already cached: where its new tokens start),
    `num_new_tokens`, and `new_token_ids` (the ids it feeds this step), plus fields each
    rank keeps for itself (`block_table`). Two steps differ when a row differs in its id,
    its cached tokens, its new tokens' count or ids, or when the rows come in another
    order: each of those makes another forward.

    Guarantees: one step gives one number in every process, however the process was
    started (under torchrun every rank is a fresh Python); the number is an int in
    [0, 2**63), so that it travels in one int64.

    Example: a decode step of two rows, request "a" (7 cached, 1 new: [42]) then request
    "b" (3 cached, 1 new: [17]), gives one number on every rank; with the two rows the
    other way round it gives another.
    """
    raise NotImplementedError("TODO: step 3")


def agree(group: TPGroup, value: int) -> bool:
    """Whether every rank passed the same `value` (an int in [0, 2**63), a fingerprint):
    True on every rank when they all did, False on every rank when any two differ.

    It runs before every forward, so it costs exactly one collective on the CPU group,
    whatever the number of ranks.

    Example: ranks passing 7 and 7 both get True; ranks passing 7 and 8 both get False.
    """
    raise NotImplementedError("TODO: step 3")


# -- step 4: an agreement every step --------------------------------------------------------


def dispatch_together(
    group: TPGroup,
    dispatcher: CudagraphDispatcher,
    num_tokens: int,
    uniform_decode: bool,
    full_ok: bool,
) -> tuple[CUDAGraphMode, BatchDescriptor]:
    """The runtime mode and graph key of this step's forward on this rank.

    `dispatcher` is built from the same ladder on every rank, and `num_tokens` and
    `uniform_decode` come from the step every rank runs. `full_ok` does not: it is a fact
    only this rank knows, whether it can run this step in a FULL graph (a switch read from
    its own environment, a check of its own memory).
    `dispatcher.dispatch(num_tokens, uniform_decode, disable_full=...)` gives the key for a
    step with or without FULL graphs.

    Guarantees: every rank returns the same (mode, descriptor), one that
    `dispatcher.dispatch` gives for this step; a rank whose `full_ok` is False is never
    sent to a FULL graph. A group of one follows its own `full_ok`, without a collective.

    Example, the ladder 1, 2, 4, 8 under FULL_AND_PIECEWISE and a decode step of 3
    requests: with `full_ok` True on every rank, every rank returns
    (FULL, BatchDescriptor(num_tokens=4, num_reqs=4, uniform=True)).
    """
    raise NotImplementedError("TODO: step 4")
