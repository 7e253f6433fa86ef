"""Lab 03, steps 5 and 6 — piecewise CUDA graphs in the simulator (your code).

Mirrors vLLM's `split_graph` (vllm/compilation/backends.py) and the PIECEWISE
`CUDAGraphWrapper` it puts around each piece (vllm/compilation/cuda_graph.py).

Attention cannot go into a full graph when its metadata (sequence lengths, block
tables) changes every step: `GraphRunner` refuses an op with `capturable=False`. The
way out is to cut the model at those ops: every splitting op becomes a piece of its
own that runs eagerly, and the runs of ops between them become pieces that are
captured, each by a GraphRunner of its own.

Given: the lab-01 simulator (the reference one, imported from mini_vllm.cudagraph, so
these steps do not depend on your lab 01), the `Piece` record and `num_captured_pieces`.
Yours: `split_ops` (step 5), then `PiecewiseGraphRunner.__init__`,
`close_capture_window` and `__call__` (step 6).

Run: pytest labs/phase-05/lab-03-cudagraph-mode -m step5   (then -m step6)
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
    _check_ops,  # given: a model is a non-empty sequence of Op or Branch
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
    """Step 5: cut the op list at every op for which `is_splitting_op(op)` is true.

    The result is a list of pieces such that:
    - each splitting op is a piece of its own, `Piece((op,), is_splitting_op=True)`;
    - the other ops form `Piece(..., is_splitting_op=False)` pieces, each holding a
      longest run of consecutive non-splitting ops (two such pieces are never adjacent);
    - no piece is empty (the model may start or end with a splitting op, or have two in
      a row), and the pieces' ops, concatenated, are `ops` in their order.
    So k splitting ops give at most k + 1 captured pieces.

    Example, with A and B splitting: [A, x, y, B, B, z] ->
    [Piece((A,), True), Piece((x, y), False), Piece((B,), True), Piece((B,), True),
    Piece((z,), False)].
    """
    raise NotImplementedError("TODO: step 5")


class PiecewiseGraphRunner:
    """Piecewise graphs: capture the pieces between splitting ops, run those ops eagerly.

    A steady-state call costs one launch per captured piece plus one per splitting op.
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
        """Step 6: split the ops (`self.pieces`) and prepare to capture every captured piece.

        Each captured piece behaves as a `GraphRunner` of its own ops would: one graph per
        input shape, captured on first sight, replayed afterwards, on `self.device`, so that
        all pieces share its launch counter and graph pool (as vLLM's pieces share one
        pool). `fallback_to_eager` means for the whole model what it means for a
        GraphRunner: after `close_capture_window()`, a piece given a shape it never
        captured runs its ops eagerly (nothing new is captured) instead of raising
        CaptureError.
        Only the model's input is checked against `dtype` (None: any dtype); a later
        piece's input is whatever the piece before it produced.
        """
        self.ops = _check_ops(ops)
        self.device = device if device is not None else SimDevice()
        self.dtype = None if dtype is None else np.dtype(dtype)
        self.pieces = split_ops(self.ops, is_splitting_op)
        raise NotImplementedError("TODO: step 6")

    @property
    def num_captured_pieces(self) -> int:
        return sum(1 for piece in self.pieces if not piece.is_splitting_op)

    def close_capture_window(self) -> None:
        """Step 6: from now on no piece captures a new graph. A call with a shape that was
        captured still replays; one with a new shape raises CaptureError (naming the shape)
        or, with fallback_to_eager, runs eagerly without capturing anything."""
        raise NotImplementedError("TODO: step 6")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Step 6: the model's output for `x`, equal to running the ops eagerly in order.

        - Captured pieces go through their graphs; splitting ops run eagerly on every
          call, so whatever they decide on the host is decided on this call's data.
        - Launches: after a shape's first call, a call costs exactly
          num_captured_pieces + (number of splitting ops) launches, in model order.
        - Errors: `x` not a numpy array -> TypeError; dtype other than `self.dtype` (when
          set) -> ValueError naming the expected dtype.

        Example: toy_model(num_layers=2, attention=True) splits into
        [rmsnorm_0] attention_0 [up_proj_0 .. rmsnorm_1] attention_1 [up_proj_1 ..]:
        a second call with the same shape launches graph, kernel, graph, kernel, graph.
        """
        raise NotImplementedError("TODO: step 6")
