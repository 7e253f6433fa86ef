"""Lab 01 — a CUDA graph simulator: capture, replay, static buffers, one graph per shape.

Your code. It mirrors mini_vllm/teaching/cudagraph.py (the reference), which mirrors
torch.cuda.CUDAGraph / `torch.cuda.graph` and vLLM's `CUDAGraphWrapper`
(vllm/compilation/cuda_graph.py).

A model is a list of ops (`Op`: a numpy function standing for one GPU kernel). The
`SimDevice` runs an op at once when no capture is open, or records it into the open
`CapturedGraph` with its output in a static buffer from the device's graph pool.
Replaying re-runs the recorded kernels on those same buffers, with one launch.
Build it that way for real (record, then re-execute the records): stale inputs and
frozen branches will then happen by themselves, exactly as on a GPU.

What is given: `Op`, `Branch`, `Node`, `CapturedGraph`, `GraphPool`, the
`SimDevice` bookkeeping (`_issue`, the clock, `capture()`), `run_eager`,
`GraphEntry`, `toy_model`. What you write, in this order (see the lab README):

1. `SimDevice.launch`   — run an op now, or record it while capturing (and refuse
                          what a graph cannot hold);
2. `SimDevice.replay`   — one launch that re-runs every recorded node;
3. `GraphRunner._check_input`, `GraphRunner._capture`, `GraphRunner.__call__`
                        — one graph per input shape: warm up, capture, copy, replay.

`split_ops` and `PiecewiseGraphRunner` are lab 03's
(labs/phase-05/lab-03-cudagraph-mode/piecewise.py);
here they are placeholders so this file has the reference's names.

Run: pytest labs/phase-05/lab-01-graph-replay-simulator
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

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


class CaptureError(RuntimeError):
    """Something that cannot happen inside, or without, a captured graph."""


@dataclass(frozen=True)
class Op:
    """One kernel: `fn` maps the input array to a new output array."""

    name: str
    fn: Callable[[np.ndarray], np.ndarray]
    gpu_us: float = 2.0  # simulated GPU time of the kernel
    capturable: bool = True  # False for attention: its metadata changes every step
    syncs_host: bool = False  # reads a device value on the host, like `.item()`
    allocates: bool = False  # asks for fresh device memory, like `torch.tensor(..., device=)`


@dataclass(frozen=True)
class Branch:
    """Python control flow between two kernels, decided on the host.

    `predicate` sees the host-side copy of the input of the forward it belongs to (a
    piece's input, under PiecewiseGraphRunner), as a model's Python code sees a Python
    int or CPU metadata. It runs whenever the Python code runs: for a captured graph,
    once, at capture.
    """

    name: str
    predicate: Callable[[np.ndarray], bool]
    if_true: Op
    if_false: Op

    @property
    def capturable(self) -> bool:
        return self.if_true.capturable and self.if_false.capturable

    def pick(self, host_input: np.ndarray) -> Op:
        return self.if_true if self.predicate(host_input) else self.if_false


ModelOp = Op | Branch


@dataclass(frozen=True)
class Node:
    """A recorded kernel launch: the op and the static buffers it reads and writes."""

    op: Op
    src: np.ndarray
    dst: np.ndarray


class CapturedGraph:
    """The recording of one capture (torch.cuda.CUDAGraph): kernels and their buffers."""

    def __init__(self, device: SimDevice) -> None:
        self.device = device
        self.nodes: list[Node] = []

    def replay(self) -> None:
        self.device.replay(self)


class GraphPool:
    """Memory that captured graphs allocate their static buffers from.

    One pool per device is shared by every graph on it, as vLLM shares one global
    graph pool among all its captures. New buffers are filled with NaN (floats) so
    that reading one before any kernel wrote it is visible, not plausible.
    """

    def __init__(self) -> None:
        self.buffers: list[np.ndarray] = []

    def allocate(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        buf = np.empty(shape, dtype=dtype)
        buf.fill(np.nan if np.issubdtype(buf.dtype, np.inexact) else 0)
        self.buffers.append(buf)
        return buf

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)


class SimDevice:
    """A pretend GPU: it counts launches and keeps a two-lane simulated clock.

    `host_us` is when the CPU is next free to issue work, `gpu_busy_until_us` when the
    GPU is. A kernel starts when both its launch is issued and the GPU is free.
    `trace` lists every launch in order: ("kernel", op name) or ("graph", node count).
    """

    def __init__(
        self, launch_us: float = 5.0, graph_launch_us: float = 5.0, node_us: float = 1.5
    ) -> None:
        self.launch_us = launch_us  # host time to issue one eager kernel
        self.graph_launch_us = graph_launch_us  # host time to launch one graph
        self.node_us = node_us  # GPU time a graph node costs beyond its kernel
        self.launches = 0  # kernel launches plus graph launches
        self.captures = 0
        self.trace: list[tuple[str, str]] = []
        self.host_us = 0.0
        self.gpu_busy_until_us = 0.0
        self.pool = GraphPool()
        self._capturing: CapturedGraph | None = None

    @property
    def is_capturing(self) -> bool:
        return self._capturing is not None

    @property
    def clock_us(self) -> float:
        """Simulated time once all issued work has finished."""
        return max(self.host_us, self.gpu_busy_until_us)

    def synchronize(self) -> float:
        """The host waits until the GPU has finished everything issued (torch.cuda.synchronize)."""
        self.host_us = self.clock_us
        return self.host_us

    def _issue(self, kind: str, name: str, host_cost_us: float, gpu_work_us: float) -> None:
        """Account for one launch on both lanes of the clock."""
        self.launches += 1
        self.trace.append((kind, name))
        self.host_us += host_cost_us
        self.gpu_busy_until_us = max(self.gpu_busy_until_us, self.host_us) + gpu_work_us

    @contextlib.contextmanager
    def capture(self, graph: CapturedGraph) -> Iterator[CapturedGraph]:
        """While open, `launch` records into `graph` instead of running (torch.cuda.graph)."""
        if self._capturing is not None:
            raise CaptureError("a capture is already open on this device; captures do not nest")
        self._capturing = graph
        try:
            yield graph
        finally:
            self._capturing = None
        self.captures += 1

    def launch(self, op: Op, x: np.ndarray) -> np.ndarray:
        """Run `op` on `x` now, or, inside a capture, record it and return its static output.

        No capture open (`self._capturing is None`): account for one kernel launch with
        `self._issue("kernel", op.name, self.launch_us, op.gpu_us)`; if `op.syncs_host`,
        the host then waits for the GPU (`self.host_us = self.gpu_busy_until_us`);
        return `op.fn(x)`.

        Capture open: launch nothing. Refuse, with a CaptureError that names the op
        (`op.name`):
          - an op with `capturable=False`: say to use PiecewiseGraphRunner or run eagerly;
          - an op with `syncs_host=True` (like `.item()`);
          - an op with `allocates=True` (fresh memory: a replay reuses fixed addresses).
        Otherwise allocate the output from `self.pool` (its shape and dtype are those of
        `op.fn` applied to zeros shaped like `x`), append `Node(op, x, out)` to the open
        graph's `nodes`, and return `out`: later ops read it, so the recorded kernels
        chain through static buffers.
        """
        raise NotImplementedError("TODO: run the op eagerly, or record a Node while capturing")

    def replay(self, graph: CapturedGraph) -> None:
        """One launch; the GPU re-runs every recorded kernel on its recorded buffers.

        Refuse (CaptureError) while a capture is open. Account for ONE launch with
        `self._issue("graph", f"{len(graph.nodes)} nodes", self.graph_launch_us, gpu_work)`
        where gpu_work sums `op.gpu_us + self.node_us` over the nodes. Then, node by node
        in order, compute `node.op.fn(node.src)` and write it INTO `node.dst`
        (`np.copyto`): the buffers are the graph's, their identity must not change.
        """
        raise NotImplementedError("TODO: one launch, then re-run each node into its static output")


def _forward(
    ops: Sequence[ModelOp], device: SimDevice, x: np.ndarray, host_input: np.ndarray
) -> np.ndarray:
    """The model's Python code: resolve branches on the host, launch each kernel in turn."""
    for op in ops:
        kernel = op.pick(host_input) if isinstance(op, Branch) else op
        x = device.launch(kernel, x)
    return x


def run_eager(ops: Sequence[ModelOp], device: SimDevice, x: np.ndarray) -> np.ndarray:
    """Run the model without graphs: one launch per kernel, branches decided on `x`."""
    return _forward(ops, device, x, host_input=x)


@dataclass
class GraphEntry:
    """One captured shape (vLLM's CUDAGraphEntry): the graph and its static buffers."""

    shape: tuple[int, ...]
    graph: CapturedGraph
    static_input: np.ndarray
    static_output: np.ndarray

    def replay(self) -> np.ndarray:
        """Replay as is, reading whatever the static input holds; returns the static output."""
        self.graph.replay()
        return self.static_output


def _check_ops(ops: Sequence[ModelOp]) -> tuple[ModelOp, ...]:
    ops = tuple(ops)
    if not ops:
        raise ValueError("a model needs at least one op")
    bad = [op for op in ops if not isinstance(op, (Op, Branch))]
    if bad:
        raise TypeError(f"a model is a sequence of Op or Branch, got {type(bad[0]).__name__}")
    return ops


class GraphRunner:
    """Full-graph capture and replay, one graph per input shape (CUDAGraphWrapper, FULL).

    The first call with a new shape warms up (one eager run), captures, and replays;
    later calls with that shape copy the input into the static buffer and replay.
    After `close_capture_window()` a new shape is an error, or runs eagerly when the
    runner was built with `fallback_to_eager=True`.
    """

    def __init__(
        self,
        ops: Sequence[ModelOp],
        device: SimDevice | None = None,
        *,
        dtype: np.dtype | type | str | None = np.float32,
        fallback_to_eager: bool = False,
    ) -> None:
        self.ops = _check_ops(ops)
        self.device = device if device is not None else SimDevice()
        self.dtype = None if dtype is None else np.dtype(dtype)  # None: accept any dtype
        self.fallback_to_eager = fallback_to_eager
        self.graphs: dict[tuple[int, ...], GraphEntry] = {}
        self.capture_window_open = True

    def close_capture_window(self) -> None:
        """From now on no new graph is captured (vLLM, after `capture_model`)."""
        self.capture_window_open = False

    def _check_input(self, x: np.ndarray) -> None:
        """Refuse what cannot go into the static buffers.

        Not a numpy array: TypeError. A dtype other than `self.dtype` (when it is not
        None): ValueError naming the dtype expected and the shapes captured so far —
        `np.copyto` would otherwise cast the input silently.
        """
        raise NotImplementedError("TODO: check the input's type and dtype")

    def _capture(self, x: np.ndarray) -> GraphEntry:
        """Capture the graph for `x.shape` and return its GraphEntry.

        1. static input: a buffer from `self.device.pool`, shaped and typed like `x`,
           holding a copy of `x`;
        2. warm-up: one eager run on the static input (`run_eager`);
        3. capture: a `CapturedGraph(self.device)`; inside `with self.device.capture(graph):`
           run the model's Python code, `_forward(self.ops, self.device, static_input,
           host_input=x)`; what it returns is the static output.
        """
        raise NotImplementedError("TODO: static input, warm-up, capture")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Run the model on `x` through the graph for `x.shape`.

        Check the input. No graph for this shape yet: if the capture window is open,
        capture one and store it in `self.graphs[x.shape]`; if it is closed, run eagerly
        when `self.fallback_to_eager`, else raise a CaptureError that lists the captured
        shapes (never capture silently). Then copy `x` into the entry's static input and
        return the entry's replay (the static output).
        """
        raise NotImplementedError(
            "TODO: look up the graph by shape, capture on first sight, copy, replay"
        )


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
    """Lab 03 (labs/phase-05/lab-03-cudagraph-mode/piecewise.py)."""
    raise NotImplementedError(
        "TODO (lab 03): split_ops lives in labs/phase-05/lab-03-cudagraph-mode/piecewise.py"
    )


class PiecewiseGraphRunner:
    """Lab 03 (labs/phase-05/lab-03-cudagraph-mode/piecewise.py)."""

    def __init__(
        self,
        ops: Sequence[ModelOp],
        device: SimDevice | None = None,
        *,
        is_splitting_op: Callable[[ModelOp], bool] = _not_capturable,
        dtype: np.dtype | type | str | None = np.float32,
        fallback_to_eager: bool = False,
    ) -> None:
        raise NotImplementedError(
            "TODO (lab 03): PiecewiseGraphRunner lives in "
            "labs/phase-05/lab-03-cudagraph-mode/piecewise.py"
        )


def toy_model(
    hidden: int = 16, num_layers: int = 2, attention: bool = False, seed: int = 0
) -> list[Op]:
    """A small decoder-shaped op list on (batch, hidden) float32 activations.

    Each layer: rmsnorm, [attention, not capturable], up-projection to 2 * hidden, gelu,
    down-projection back to hidden. The weights are fixed by `seed`.
    """
    rng = np.random.default_rng(seed)
    ops: list[Op] = []

    def rmsnorm(x: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5)

    def self_attention(x: np.ndarray) -> np.ndarray:
        # Every row attends to every row of the batch: its work depends on the batch's
        # contents, the way real attention depends on per-step sequence lengths.
        scores = x @ x.T / math.sqrt(x.shape[-1])
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        return (weights / weights.sum(axis=-1, keepdims=True)) @ x

    def gelu(x: np.ndarray) -> np.ndarray:
        return 0.5 * x * (1.0 + np.tanh(0.7978845608 * (x + 0.044715 * x**3)))

    for i in range(num_layers):
        w_up = (rng.standard_normal((hidden, 2 * hidden)) / np.sqrt(hidden)).astype(np.float32)
        w_down = (rng.standard_normal((2 * hidden, hidden)) / np.sqrt(2 * hidden)).astype(
            np.float32
        )
        ops.append(Op(f"rmsnorm_{i}", rmsnorm, gpu_us=2.0))
        if attention:
            ops.append(Op(f"attention_{i}", self_attention, gpu_us=8.0, capturable=False))
        ops.append(Op(f"up_proj_{i}", lambda x, w=w_up: x @ w, gpu_us=4.0))
        ops.append(Op(f"gelu_{i}", gelu, gpu_us=2.0))
        ops.append(Op(f"down_proj_{i}", lambda x, w=w_down: x @ w, gpu_us=4.0))
    return ops
