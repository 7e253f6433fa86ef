"""Lab 03, part 3 — piecewise CUDA graphs in the simulator (your code).

Mirrors `split_ops` and `PiecewiseGraphRunner` in mini_vllm/teaching/cudagraph.py, which mirror
vLLM's `split_graph` (vllm/compilation/backends.py) and the PIECEWISE
`CUDAGraphWrapper`s it puts around each piece (vllm/compilation/cuda_graph.py).

Attention cannot go into a full graph when its metadata (sequence lengths, block
tables) changes every step: `GraphRunner` refuses an op with `capturable=False`. The
way out is to cut the model at those ops: every splitting op becomes a piece of its
own that runs eagerly, and the runs of ops between them become pieces that are
captured, each with its own GraphRunner.

Given: the lab-01 simulator (the reference one from mini_vllm.cudagraph, so this part
does not depend on your lab 01), the `Piece` record and `num_captured_pieces`. Yours:
`split_ops`, then `PiecewiseGraphRunner.__init__` (the runners), `close_capture_window`
and `__call__`.

Run: pytest labs/phase-05/lab-03-cudagraph-mode -k piecewise
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from mini_vllm.cudagraph import (
    Branch,
    CapturedGraph,
    CaptureError,
    GraphEntry,
    GraphPool,
    GraphRunner,
    Node,
    Op,
    SimDevice,
    run_eager,
    toy_model,
)

__all__ = [
    "Branch",
    "CaptureError",
    "CapturedGraph",
    "GraphEntry",
    "GraphPool",
    "GraphRunner",
    "Node",
    "Op",
    "Piece",
    "PiecewiseGraphRunner",
    "SimDevice",
    "run_eager",
    "split_ops",
    "toy_model",
]

ModelOp = Op | Branch


@dataclass(frozen=True)
class Piece:
    """A run of ops after the split (vLLM's SplitItem):
    captured, or one splitting op run eagerly."""

    ops: tuple[ModelOp, ...]
    is_splitting_op: bool


def _not_capturable(op: ModelOp) -> bool:
    return not op.capturable


def split_ops(
    ops: Sequence[ModelOp], is_splitting_op: Callable[[ModelOp], bool] = _not_capturable
) -> list[Piece]:
    """Cut the op list at every op for which `is_splitting_op(op)` is true.

    Walk the ops in order. Each splitting op becomes `Piece((op,), is_splitting_op=True)`;
    each maximal run of other ops between them becomes `Piece(tuple(run),
    is_splitting_op=False)`. Never emit an empty piece (the model may start or end
    with a splitting op, or have two in a row). So k splitting ops give at most k + 1
    captured pieces, and the pieces' ops, concatenated, are `ops` in order.
    """
    raise NotImplementedError(
        "TODO: walk the ops; a splitting op is a piece of its own; no empty piece"
    )


class PiecewiseGraphRunner:
    """Piecewise graphs: capture the pieces between splitting ops, run those ops eagerly.

    A replay costs one launch per captured piece plus one per splitting op.
    """

    def __init__(
        self,
        ops: Sequence[ModelOp],
        device: SimDevice | None = None,
        *,
        is_splitting_op: Callable[[ModelOp], bool] = _not_capturable,
        dtype: np.dtype | type | str | None = np.float32,
        fallback_to_eager: bool = False,
    ) -> None:
        """Split the ops and give every captured piece its own GraphRunner.

        All runners share `self.device` (and so its graph pool, as vLLM's pieces share
        one pool). Build them with `dtype=None`: only the model's input is checked
        against `dtype` (in `__call__`); a later piece's input is whatever the piece
        before it produced. Pass `fallback_to_eager` on.
        """
        self.ops = tuple(ops)
        self.device = device if device is not None else SimDevice()
        self.dtype = None if dtype is None else np.dtype(dtype)
        self.pieces = split_ops(self.ops, is_splitting_op)
        raise NotImplementedError("TODO: one GraphRunner per captured piece, sharing self.device")

    @property
    def num_captured_pieces(self) -> int:
        return sum(1 for piece in self.pieces if not piece.is_splitting_op)

    def close_capture_window(self) -> None:
        """Close the capture window of every piece's runner."""
        raise NotImplementedError("TODO: close every runner's capture window")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Run the model on `x`: piece by piece, in order.

        Refuse an input that is not a numpy array (TypeError) or whose dtype is not
        `self.dtype` (ValueError naming the expected dtype). Then feed each piece the
        output of the one before: a captured piece goes through its GraphRunner (which
        captures on first sight of a shape and replays after), a splitting op runs
        eagerly (`run_eager`) on every call.
        """
        raise NotImplementedError(
            "TODO: replay captured pieces, run splitting ops eagerly between them"
        )
