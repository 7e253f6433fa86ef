"""A CUDA-graph look-alike for the CPU: capture records ATen ops, replay re-runs them.

PyTorch counterpart: torch.cuda.CUDAGraph (`capture_begin`, `capture_end`, `replay`,
`reset`) and the `torch.cuda.graph` context manager. CUDA records kernels and the
device addresses they touch; this records the ATen operators the forward executes,
through PyTorch's dispatch mechanism (`TorchDispatchMode`), together with the very
tensor objects they read and write. Replaying re-runs every recorded operator on those
same tensors and writes each result into the tensor the capture produced.

So it has the semantics that matter, and the constraints follow by themselves:
- static buffers: a replay reads the tensors it saw at capture, so an input that was
  not copied into them gives the old answer (stale input, silently);
- the output of a replay is the same tensor object every time, overwritten;
- Python control flow is frozen: only ATen ops are recorded, never the `if` around them;
- shapes are frozen: one graph per shape;
- no host syncs during capture: `.item()`, `.tolist()`, `.numpy()`, `nonzero`,
  `torch.equal` and friends raise, naming the op.
What it does not have is the speed: replay still calls each operator from Python. It
exists so the CUDA-graph model runner runs, and is tested, where there is no GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from mini_vllm import compat
from mini_vllm.compat import tree_flatten, tree_map

__all__ = ["CPUGraph", "CallableGraph", "CaptureError", "cpu_graph"]

aten = torch.ops.aten

# Operators that hand a tensor's value (or a shape that depends on it) back to the
# host: under CUDA-graph capture these either raise or silently break the graph.
_HOST_SYNC_OPS = {
    aten._local_scalar_dense.default,  # .item(), .tolist(), int(tensor), bool(tensor)
    aten.nonzero.default,
    aten.equal.default,
    aten.is_nonzero.default,
    aten.masked_select.default,
    aten.unique_consecutive.default,
    aten._unique2.default,
}


class CaptureError(RuntimeError):
    """An operation that cannot be recorded into a graph."""


@dataclass
class _Node:
    func: Any  # an ATen op overload
    args: tuple
    kwargs: dict
    outputs: Any  # what the capture produced; replay writes into these tensors
    mode: str  # "mutate" (re-run for its side effect), "view" (nothing to do), "compute"


def _replay_mode(func: Any) -> str:
    schema = compat.op_schema(func)
    if any(arg.alias_info is not None and arg.alias_info.is_write for arg in schema.arguments):
        return "mutate"  # in-place or out= ops: re-running them redoes the write
    if any(ret.alias_info is not None for ret in schema.returns):
        return "view"  # shares storage with its input: it follows the input by itself
    return "compute"


class _RecordingMode(compat.dispatch_mode_base()):
    def __init__(self, graph: CPUGraph) -> None:
        super().__init__()
        self.graph = graph

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _HOST_SYNC_OPS:
            raise CaptureError(
                f"{func} reads a tensor's value on the host during graph capture (a host "
                "sync, like .item() or .tolist()); a replayed graph cannot hand values back "
                "to Python. Move it out of the captured region and run it after the replay"
            )
        outputs = func(*args, **kwargs)
        flat, _ = tree_flatten(outputs)
        # None is what ops that only write their arguments return (mini_vllm::attention).
        if any(x is not None and not isinstance(x, torch.Tensor) for x in flat):
            raise CaptureError(
                f"{func} returned a host value "
                f"({type(next(x for x in flat if not isinstance(x, torch.Tensor))).__name__}) "
                "during graph capture; only tensor operations can be recorded"
            )
        self.graph._nodes.append(_Node(func, args, kwargs, outputs, _replay_mode(func)))
        return outputs


def _refuse_host_read(name: str):
    def refuse(self, *args, **kwargs):
        raise CaptureError(
            f"Tensor.{name}() reads a tensor's value on the host during "
            "graph capture (a host sync); a replayed graph cannot hand "
            "values back to Python. Move it out of the captured region"
        )

    return refuse


# On a CPU tensor these read memory directly, without an ATen op the recorder could
# see, so they are refused by name while a capture is open.
_HOST_READ_METHODS = ("tolist", "numpy")


class CPUGraph:
    """Same methods as torch.cuda.CUDAGraph, for CPU tensors."""

    def __init__(self) -> None:
        self._nodes: list[_Node] = []
        self._mode: _RecordingMode | None = None
        self._saved_methods: dict[str, Any] = {}
        self._captured = False

    @property
    def num_nodes(self) -> int:
        return len(self._nodes)

    def capture_begin(self, pool: object = None) -> None:
        if self._captured or self._mode is not None:
            raise CaptureError(
                "this graph was already captured; call reset() before capturing again"
            )
        self._mode = _RecordingMode(self)
        self._mode.__enter__()
        for name in _HOST_READ_METHODS:
            self._saved_methods[name] = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, _refuse_host_read(name))

    def capture_end(self) -> None:
        if self._mode is None:
            raise CaptureError("capture_end() without capture_begin()")
        for name, method in self._saved_methods.items():
            setattr(torch.Tensor, name, method)
        self._saved_methods.clear()
        self._mode.__exit__(None, None, None)
        self._mode = None
        self._captured = True

    # ANCHOR: cpu_replay
    def replay(self) -> None:
        """Re-run every recorded op on the recorded tensors, in order."""
        if not self._captured:
            raise CaptureError("replay() before the graph was captured")
        # The recorded tensors are usually inference tensors (captured under
        # torch.inference_mode); writing them is only allowed in that mode.
        with torch.inference_mode():
            self._replay_nodes()

    def _replay_nodes(self) -> None:
        for node in self._nodes:
            if node.mode == "view":
                continue
            result = node.func(*node.args, **node.kwargs)
            if node.mode == "compute":
                # Results land in the tensors the capture produced, which later
                # nodes (and the caller) hold: same addresses on every replay.
                if isinstance(node.outputs, torch.Tensor):
                    node.outputs.copy_(result)
                else:
                    tree_map(
                        lambda dst, src: dst.copy_(src) if isinstance(dst, torch.Tensor) else None,
                        node.outputs,
                        result,
                    )

    # ANCHOR_END: cpu_replay

    def reset(self) -> None:
        self._nodes.clear()
        self._captured = False

    def pool(self) -> None:  # torch.cuda.CUDAGraph.pool(); CPU memory needs no pool
        return None


@contextlib.contextmanager
def cpu_graph(graph: CPUGraph, pool: object = None, stream: object = None) -> Iterator[CPUGraph]:
    """The `torch.cuda.graph(graph, pool=..., stream=...)` context manager, for CPUGraph."""
    graph.capture_begin(pool)
    try:
        yield graph
    finally:
        graph.capture_end()


# ANCHOR: callable_graph
class CallableGraph:
    """Capture and replay at the level of one call, for code the recorder cannot see into.

    Inductor's CPU kernels are compiled C++ called directly, not ATen operators, so the
    dispatch-level recorder would miss them. Compiled code has no Python control flow
    left in it, though, so re-running the compiled callable on the captured arguments
    keeps the semantics that matter: it reads the static input buffers (stale if not
    copied in), and its results are copied into the output captured the first time,
    which every replay returns.
    """

    def __init__(self) -> None:
        self._call: tuple | None = None
        self.output = None

    def capture(self, runnable, args: tuple, kwargs: dict):
        if self._call is not None:
            raise CaptureError("this graph was already captured")
        self._call = (runnable, args, kwargs)
        self.output = runnable(*args, **kwargs)
        return self.output

    def replay(self) -> None:
        if self._call is None:
            raise CaptureError("replay() before the graph was captured")
        runnable, args, kwargs = self._call
        with torch.inference_mode():
            result = runnable(*args, **kwargs)
            tree_map(
                lambda dst, src: dst.copy_(src) if isinstance(dst, torch.Tensor) else None,
                self.output,
                result,
            )


# ANCHOR_END: callable_graph
