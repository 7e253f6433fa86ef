"""Lab 01 — a CUDA graph simulator: capture, replay, static buffers, one graph per shape.

Your code. It models torch.cuda.CUDAGraph / `torch.cuda.graph` and vLLM's
`CUDAGraphWrapper` (vllm/compilation/cuda_graph.py).

A model is a list of ops (`Op`: a numpy function standing for one GPU kernel). The
`SimDevice` runs an op at once when no capture is open, or records it into the open
`CapturedGraph` with its output in a static buffer from the device's graph pool.
Replaying re-runs the recorded kernels on those same buffers, with one launch.
Build it that way for real (record, then re-execute the records): stale inputs and
frozen branches will then happen by themselves, exactly as on a GPU.

What is given: `Op`, `Branch`, `Node`, `CapturedGraph`, `GraphPool`, the
`SimDevice` bookkeeping (`_issue`, the clock, `capture()`), `run_eager`,
`GraphEntry`, `toy_model`. What you write, one step each (see the lab README):

1. `SimDevice.launch`   — run an op now, or record it while a capture is open, and
                          refuse what a graph cannot hold;
2. `SimDevice.replay`   — one launch that re-runs the recorded nodes on their buffers;
3. `GraphRunner._check_input`, `GraphRunner._capture`, `GraphRunner.__call__`
                        — one graph per input shape, fed through static buffers.

Each TODO's docstring says what the function must guarantee; how is up to you.

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
    # copies host data to the device and waits, like `torch.tensor([1, 2], device="cuda")`
    copies_from_host: bool = False


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

        No capture open — the op runs:
          - returns `op.fn(x)`;
          - exactly one launch is accounted: `launches` grows by 1, `trace` gains
            ("kernel", op.name), `host_us` grows by `launch_us`, and the GPU lane is busy
            for `op.gpu_us` from the later of when it was free and when the launch ends;
          - a synchronous op (`syncs_host` or `copies_from_host`) returns only once the
            GPU is done: afterwards `host_us == gpu_busy_until_us`.

        A capture open (`capture()`) — the op is recorded, not run:
          - no launch: `launches`, `trace` and both clocks are unchanged;
          - returns a new buffer from `self.pool` with the shape and dtype `op.fn(x)`
            would have (its contents are not computed yet); the pool keeps it for as long
            as the graph lives;
          - the open graph's `nodes` gains one `Node(op, x, out)`: `x` itself, not a
            copy, so a replay reads whatever `x` holds then;
          - an op the graph cannot hold raises `CaptureError` with `op.name` in the
            message, and nothing is recorded: `capturable=False` (the message also says
            to use PiecewiseGraphRunner or to run eagerly), `syncs_host`,
            `copies_from_host`. Allocating is NOT refused: that is what the pool is for.

        Example, with `SimDevice()` and `double = Op("double", lambda v: 2 * v)`:
          eager: `launch(double, np.array([[1., 2.]], np.float32))` returns [[2., 4.]];
                 launches 0 -> 1, host_us 0.0 -> 5.0, gpu_busy_until_us 0.0 -> 7.0.
          inside `with device.capture(graph):` the same call returns a (1, 2) float32
                 buffer `b` with `device.pool.buffers[-1] is b`; launches stays 0;
                 `graph.nodes == [Node(double, x, b)]`.
        """
        raise NotImplementedError("TODO: run the op now, or record it while a capture is open")

    def replay(self, graph: CapturedGraph) -> None:
        """Re-run a captured graph on its own buffers, with one launch.

        Guarantees:
          - `CaptureError` while a capture is open on this device, or when `graph` was
            captured on another device; nothing is launched then;
          - exactly one launch: `launches` grows by 1, `trace` gains
            ("graph", f"{len(graph.nodes)} nodes"), `host_us` grows by `graph_launch_us`,
            and the GPU lane then runs every recorded kernel, each node costing `node_us`
            of GPU time on top of its kernel's own `gpu_us`;
          - afterwards each node's `dst` holds `op.fn` of what its `src` held when that
            node ran, the nodes running in recording order (a node reads the fresh
            output of the node before it);
          - every buffer keeps its identity: no node's `dst` is replaced by a new array.

        Example, `SimDevice()` (graph_launch_us 5, node_us 1.5) and a graph that recorded
        "double" then "add_one" (gpu_us 2 each) on a static input holding [[1., 2.]]:
        after `replay`, the second node's `dst` holds [[3., 5.]]; launches +1; on a fresh
        device host_us is 5.0 and gpu_busy_until_us is 12.0.
        """
        raise NotImplementedError("TODO: one launch that re-runs the recorded nodes in place")


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
        """Refuse an input that cannot go into the static buffers; return None otherwise.

          - `x` not a numpy array: TypeError;
          - `self.dtype` set and `x.dtype` different: ValueError whose message names the
            dtype expected and lists the shapes captured so far (`np.copyto` would
            otherwise cast the input into the static buffer without a word);
          - `self.dtype` None: a shape not captured yet is accepted in any dtype. What a
            captured shape does when it comes back in another dtype is left to you (the
            README's step 3 asks).
        Runs before any capture, so a refused input never leaves a graph behind.

        Example: `GraphRunner(ops)` (float32) refuses `np.zeros((2, 8))` (float64) with
        a ValueError mentioning "float32", whether or not (2, 8) was captured.
        """
        raise NotImplementedError("TODO: refuse a non-array, and a dtype the buffers do not hold")

    def _capture(self, x: np.ndarray) -> GraphEntry:
        """Capture the graph for `x.shape` and return its entry (not stored: the caller does).

        Guarantees, for a model of n kernels (branches resolved on `x`):
          - the returned `GraphEntry` has `shape == x.shape`, a `CapturedGraph` on this
            device with n nodes, a `static_input` holding a copy of `x` (same shape and
            dtype), and the `static_output` its last node writes;
          - `static_input` and every node's output are buffers of `self.device.pool`,
            so `device.pool.nbytes` grows by exactly their sizes (the graph's memory);
          - before the capture the model runs once eagerly on the static input (the
            warm-up PyTorch asks for): n kernel launches, then no launch at all while
            capturing; `device.captures` grows by 1;
          - an op the graph cannot hold raises `CaptureError` and leaves no capture open.

        Example: `toy_model(hidden=16, num_layers=2)` (8 ops) and `x` of shape (4, 16):
        8 launches in `trace`, `captures` +1, 9 new pool buffers, 3328 bytes.
        """
        raise NotImplementedError("TODO: a static input, a warm-up, then the capture")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """The model's output for `x`, through the graph for `x.shape`.

        Guarantees:
          - `x` is checked first (`_check_input`);
          - the first call with a shape, while the capture window is open, captures a
            graph and stores its entry in `self.graphs[x.shape]`; later calls with that
            shape reuse it (no new capture, one launch each);
          - a new shape once the window is closed: an eager run (one launch per kernel,
            nothing stored) when `fallback_to_eager`, else a `CaptureError` listing the
            captured shapes; never a silent capture;
          - a replayed result is computed from `x`, not from an earlier input, and is
            the entry's `static_output` itself (the same array every call, overwritten
            by the next replay of that shape).

        Example: calls with shapes (4, 16), (4, 16), (8, 16) on a fresh runner of the
        8-op toy model: `set(runner.graphs) == {(4, 16), (8, 16)}`, `device.captures ==
        2`, `device.launches == 9 + 1 + 9`.
        """
        raise NotImplementedError("TODO: look the graph up by shape, capture on first sight")


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
