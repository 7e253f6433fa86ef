"""A CPU simulator of CUDA graph capture and replay, in numpy.

A model is a list of ops (`Op`: a numpy function standing for one GPU kernel). A
`SimDevice` runs them eagerly, one launch each, or, while a capture is open, records
them into a `CapturedGraph` instead of running them, with their outputs in static
buffers from the device's graph pool. Replaying the graph re-runs the recorded kernels
on those same buffers with one launch. Everything that surprises people about CUDA
graphs follows from that, without special cases: a replay reads whatever sits in the
static input buffer (stale data if nobody copied the new input in), returns the same
output buffer every time, and repeats the Python decisions made at capture.

Allocation during capture is allowed, as on a GPU: every output a captured kernel
produces gets a buffer from the graph pool, and that buffer lives on at its fixed
address for as long as the graph does (which is why the next replay overwrites the
last one's output). What a capture refuses is anything that needs the host in the
middle of the stream: a host sync (`.item()`, printing a tensor, a device-to-host
copy) and a synchronous copy of host data to the device (`torch.tensor(list,
device="cuda")`, a blocking `.to("cuda")` of a CPU tensor).

Real counterparts:
- torch.cuda.CUDAGraph and `torch.cuda.graph` (capture, replay, the graph's private
  memory pool, the no-sync rules of PyTorch's CUDA semantics notes) -> `SimDevice`,
  `CapturedGraph`, `GraphPool`;
- vllm/compilation/cuda_graph.py, `CUDAGraphWrapper.__call__` (one entry per batch
  descriptor, capture on first sight, replay afterwards, refuse capture once the
  capture window is closed) -> `GraphRunner`; unlike vLLM's wrapper, which leaves
  warm-up to `GPUModelRunner.capture_model` and input copies to the model runner's
  persistent buffers, `GraphRunner` does both itself so it can stand alone;
- vllm/compilation/backends.py, `split_graph` (cut the model at the splitting ops,
  attention) and the PIECEWISE wrappers around each piece -> `split_ops`,
  `PiecewiseGraphRunner`.
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


# ANCHOR: op
# ANCHOR: op_class
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


# ANCHOR_END: op_class


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


# ANCHOR_END: op


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


# ANCHOR: sim_device
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

    # ANCHOR: launch
    # ANCHOR: launch_eager
    def launch(self, op: Op, x: np.ndarray) -> np.ndarray:
        """Run `op` on `x` now, or, inside a capture, record it and return its static output."""
        graph = self._capturing
        if graph is None:
            self._issue("kernel", op.name, self.launch_us, op.gpu_us)
            if op.syncs_host or op.copies_from_host:  # a synchronous op: the CPU waits
                self.host_us = self.gpu_busy_until_us
            return op.fn(x)
        # ANCHOR_END: launch_eager
        if not op.capturable:
            raise CaptureError(
                f"op {op.name!r} is not capturable (capturable=False, as attention "
                "is) and cannot be recorded into a full graph; use PiecewiseGraphRunner "
                "to split the model around it, or run the model eagerly"
            )
        if op.syncs_host:
            raise CaptureError(
                f"op {op.name!r} syncs with the host (like .item()) during capture: "
                "a graph cannot hand a value back to Python mid-replay; move "
                "it out of the captured ops and run it eagerly after the replay"
            )
        if op.copies_from_host:
            raise CaptureError(
                f"op {op.name!r} copies host data to the device and waits for it during "
                "capture (like torch.tensor(list, device='cuda')): a replay never reads "
                "the host again; fill a static device buffer before capture, or copy "
                "into it before each replay"
            )
        # ANCHOR: launch_record
        # Capture records and does not compute. Only the output's shape and dtype are
        # needed, so run the kernel on zeros (PyTorch would use meta tensors). The output
        # is allocated from the graph's pool, and stays there as long as the graph does.
        with np.errstate(all="ignore"):
            probe = np.asarray(op.fn(np.zeros_like(x)))
        out = self.pool.allocate(probe.shape, probe.dtype)
        graph.nodes.append(Node(op, x, out))
        return out
        # ANCHOR_END: launch_record

    # ANCHOR_END: launch

    # ANCHOR: replay
    def replay(self, graph: CapturedGraph) -> None:
        """One launch; the GPU re-runs every recorded kernel on its recorded buffers."""
        if self._capturing is not None:
            raise CaptureError("cannot replay a graph while a capture is open")
        if graph.device is not self:
            raise CaptureError("this graph was captured on another device")
        gpu_work = sum(node.op.gpu_us + self.node_us for node in graph.nodes)
        self._issue("graph", f"{len(graph.nodes)} nodes", self.graph_launch_us, gpu_work)
        for node in graph.nodes:
            np.copyto(node.dst, node.op.fn(node.src))

    # ANCHOR_END: replay


# ANCHOR_END: sim_device


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


def _check_array(
    x: np.ndarray, expected: np.dtype | None, shapes: list[tuple[int, ...]] | None = None
) -> None:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"input must be a numpy array, got {type(x).__name__}")
    if expected is not None and x.dtype != expected:
        known = "" if shapes is None else f" (captured shapes: {shapes or 'none yet'})"
        raise ValueError(
            f"input has dtype {x.dtype} but the static buffers are "
            f"{expected}; pass a {expected} array of shape (batch, ...){known}"
        )


def _check_ops(ops: Sequence[ModelOp]) -> tuple[ModelOp, ...]:
    ops = tuple(ops)
    if not ops:
        raise ValueError("a model needs at least one op")
    bad = [op for op in ops if not isinstance(op, (Op, Branch))]
    if bad:
        raise TypeError(f"a model is a sequence of Op or Branch, got {type(bad[0]).__name__}")
    return ops


# ANCHOR: graph_runner
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
        # np.copyto would cast a wrong dtype into the static buffer without a word.
        expected = self.dtype
        if expected is None and isinstance(x, np.ndarray) and x.shape in self.graphs:
            expected = self.graphs[x.shape].static_input.dtype  # fixed once captured
        _check_array(x, expected, sorted(self.graphs))

    # ANCHOR: capture
    def _capture(self, x: np.ndarray) -> GraphEntry:
        static_input = self.device.pool.allocate(x.shape, x.dtype)
        np.copyto(static_input, x)
        # Warm-up: one eager run first, as PyTorch asks before capture (lazy
        # initialisation, autotuning and allocator state happen outside the graph).
        run_eager(self.ops, self.device, static_input)
        graph = CapturedGraph(self.device)
        with self.device.capture(graph):
            static_output = _forward(self.ops, self.device, static_input, host_input=x)
        return GraphEntry(x.shape, graph, static_input, static_output)

    # ANCHOR_END: capture

    # ANCHOR: runner_call
    def __call__(self, x: np.ndarray) -> np.ndarray:
        self._check_input(x)
        entry = self.graphs.get(x.shape)
        if entry is None:
            if not self.capture_window_open:
                if self.fallback_to_eager:
                    return run_eager(self.ops, self.device, x)
                raise CaptureError(
                    f"no graph for input shape {x.shape} and the capture window is "
                    f"closed; captured shapes: {sorted(self.graphs)}. Pad the input "
                    "to one of them, or build the runner with fallback_to_eager=True"
                )
            entry = self.graphs[x.shape] = self._capture(x)
        # The graph reads the static input, never `x`: copy the new data in first.
        np.copyto(entry.static_input, x)
        return entry.replay()

    # ANCHOR_END: runner_call


# ANCHOR_END: graph_runner


# ANCHOR: split_ops
@dataclass(frozen=True)
class Piece:
    """A run of ops after the split (vLLM's SplitItem):
    captured, or one splitting op run eagerly."""

    ops: tuple[ModelOp, ...]
    is_splitting_op: bool


def _not_capturable(op: ModelOp) -> bool:
    return not op.capturable


# ANCHOR: split_ops_fn
def split_ops(
    ops: Sequence[ModelOp], is_splitting_op: Callable[[ModelOp], bool] = _not_capturable
) -> list[Piece]:
    """Cut the op list at every splitting op: each splitting op is a piece of its own,
    the ops between them form the capturable pieces. No piece is empty; order is kept."""
    pieces: list[Piece] = []
    run: list[ModelOp] = []
    for op in ops:
        if is_splitting_op(op):
            if run:
                pieces.append(Piece(tuple(run), is_splitting_op=False))
                run = []
            pieces.append(Piece((op,), is_splitting_op=True))
        else:
            run.append(op)
    if run:
        pieces.append(Piece(tuple(run), is_splitting_op=False))
    return pieces


# ANCHOR_END: split_ops_fn


# ANCHOR_END: split_ops


# ANCHOR: piecewise_runner
class PiecewiseGraphRunner:
    """Piecewise graphs: capture the pieces between splitting ops, run those ops eagerly.

    Each capturable piece gets its own GraphRunner (vLLM wraps each piece of the split
    graph in a PIECEWISE CUDAGraphWrapper); all share the device and its graph pool.
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
        self.ops = _check_ops(ops)
        self.device = device if device is not None else SimDevice()
        self.dtype = None if dtype is None else np.dtype(dtype)
        self.pieces = split_ops(self.ops, is_splitting_op)
        # Only the model's input is checked against `dtype`; a later piece's input is
        # whatever the piece before it produced.
        self._runners = [
            None
            if piece.is_splitting_op
            else GraphRunner(
                piece.ops, self.device, dtype=None, fallback_to_eager=fallback_to_eager
            )
            for piece in self.pieces
        ]

    @property
    def num_captured_pieces(self) -> int:
        return sum(1 for piece in self.pieces if not piece.is_splitting_op)

    def close_capture_window(self) -> None:
        for runner in self._runners:
            if runner is not None:
                runner.close_capture_window()

    # ANCHOR: piecewise_call
    def __call__(self, x: np.ndarray) -> np.ndarray:
        _check_array(x, self.dtype)
        for piece, runner in zip(self.pieces, self._runners):
            # A splitting op runs eagerly every time, so its host-side decisions are fresh.
            x = run_eager(piece.ops, self.device, x) if runner is None else runner(x)
        return x

    # ANCHOR_END: piecewise_call


# ANCHOR_END: piecewise_runner


# ANCHOR: toy_model
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


# ANCHOR_END: toy_model
