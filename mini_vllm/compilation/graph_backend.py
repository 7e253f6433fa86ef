"""What capturing a graph needs from the device, for CUDA and for the CPU look-alike.

vLLM counterpart: the platform hooks in vllm/platforms/ (`current_platform.graph_pool_handle`,
`get_global_graph_pool`) and the torch.cuda calls in vllm/compilation/cuda_graph.py and
`GPUModelRunner.capture_model` (side-stream warm-up, `torch.cuda.graph`,
`torch.cuda.mem_get_info`). One small class per device keeps the wrapper and the runner
free of `if device == "cuda"` branches: the backend decides what kind of graph records a
call, and the wrapper only asks it to capture one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from mini_vllm.compilation.cpu_graph import CallableGraph, CPUGraph, cpu_graph
from mini_vllm.errors import UserError

__all__ = ["CPUGraphBackend", "CUDAGraphBackend", "GraphBackend", "graph_backend_for"]


class GraphBackend:
    name = "abstract"

    def capture(
        self, runnable: Callable[..., Any], args: tuple, kwargs: dict, pool: Any
    ) -> tuple[Any, Any]:
        """Record one call `runnable(*args, **kwargs)` into a new graph: `(graph, output)`.

        The graph has `replay()`; each replay recomputes `output` in place, from whatever
        the captured inputs hold by then.
        """
        raise NotImplementedError

    def new_pool(self) -> Any:
        """A memory pool every graph of the engine captures into (one per engine)."""
        return None

    def warmup_context(self) -> contextlib.AbstractContextManager:
        """Where the eager warm-up before a capture runs."""
        return contextlib.nullcontext()

    def synchronize(self) -> None:
        pass

    def pool_memory(self, pool: Any) -> int | None:
        """Bytes the device holds in `pool` (what the graphs captured into it keep), or
        None where the device has no such measure."""
        return None


# ANCHOR: cuda_graph_backend
class CUDAGraphBackend(GraphBackend):
    name = "cuda"

    def __init__(self, device: torch.device) -> None:
        self.device = device

    # ANCHOR: cuda_capture
    def capture(self, runnable, args, kwargs, pool):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            output = runnable(*args, **kwargs)
        return graph, output

    def new_pool(self) -> Any:
        return torch.cuda.graph_pool_handle()

    @contextlib.contextmanager
    def warmup_context(self) -> Iterator[None]:
        # PyTorch asks for warm-up on a side stream: lazy initialisation (cuBLAS
        # handles, autotuning, allocator growth) must not land on the capture stream.
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            yield
        torch.cuda.current_stream(self.device).wait_stream(side)

    # ANCHOR_END: cuda_capture

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def pool_memory(self, pool: Any) -> int | None:
        # The caching allocator's segments that belong to the graph pool. Unlike "free
        # memory before minus after capture" (vLLM's measure, in capture_model), no
        # other allocation or free in the process, compilation's included, moves it.
        pool_id = tuple(pool)
        return sum(
            segment["total_size"]
            for segment in torch.cuda.memory_snapshot()
            if tuple(segment.get("segment_pool_id", ())) == pool_id
            and segment["device"] == self.device.index
        )


# ANCHOR_END: cuda_graph_backend


class CPUGraphBackend(GraphBackend):
    name = "cpu-recording"

    def capture(self, runnable, args, kwargs, pool):
        if getattr(runnable, "runs_compiled_code", False):
            # Inductor's CPU kernels are C++ called directly, not ATen operators the
            # recorder could see: record the call itself (mini_vllm/compilation/cpu_graph.py).
            graph = CallableGraph()
            return graph, graph.capture(runnable, args, kwargs)
        graph = CPUGraph()
        with cpu_graph(graph, pool=pool):
            output = runnable(*args, **kwargs)
        return graph, output


def graph_backend_for(device: torch.device | str) -> GraphBackend:
    device = torch.device(device)
    if device.type == "cuda":
        return CUDAGraphBackend(device)
    if device.type == "cpu":
        return CPUGraphBackend()
    raise UserError(f"no graph backend for device type {device.type!r}; use 'cuda' or 'cpu'")
