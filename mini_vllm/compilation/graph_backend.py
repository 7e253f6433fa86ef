"""What capturing a graph needs from the device, for CUDA and for the CPU look-alike.

vLLM counterpart: the platform hooks in vllm/platforms/ (`current_platform.graph_pool_handle`,
`get_global_graph_pool`) and the torch.cuda calls in vllm/compilation/cuda_graph.py and
`GPUModelRunner.capture_model` (side-stream warm-up, `torch.cuda.graph`,
`torch.cuda.mem_get_info`). One small class per device keeps the wrapper and the runner
free of `if device == "cuda"` branches.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from mini_vllm.compilation.cpu_graph import CPUGraph, cpu_graph

__all__ = ["CPUGraphBackend", "CUDAGraphBackend", "GraphBackend", "graph_backend_for"]


class GraphBackend:
    name = "abstract"
    # True when a capture records ATen operators (the CPU recorder) rather than the
    # device's kernels: compiled code must then be captured at the call level.
    records_aten_ops = False

    def new_graph(self) -> Any:
        raise NotImplementedError

    def new_pool(self) -> Any:
        """A memory pool every graph of the engine captures into (one per engine)."""
        return None

    def capture(self, graph: Any, pool: Any) -> "contextlib.AbstractContextManager":
        raise NotImplementedError

    def warmup_context(self) -> "contextlib.AbstractContextManager":
        """Where the eager warm-up before a capture runs."""
        return contextlib.nullcontext()

    def synchronize(self) -> None:
        pass

    def free_memory(self) -> int | None:
        """Free device memory in bytes, or None where it cannot be read."""
        return None


# ANCHOR: cuda_graph_backend
class CUDAGraphBackend(GraphBackend):
    name = "cuda"

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def new_graph(self) -> torch.cuda.CUDAGraph:
        return torch.cuda.CUDAGraph()

    def new_pool(self) -> Any:
        return torch.cuda.graph_pool_handle()

    def capture(self, graph: torch.cuda.CUDAGraph, pool: Any):
        return torch.cuda.graph(graph, pool=pool)

    @contextlib.contextmanager
    def warmup_context(self) -> Iterator[None]:
        # PyTorch asks for warm-up on a side stream: lazy initialisation (cuBLAS
        # handles, autotuning, allocator growth) must not land on the capture stream.
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            yield
        torch.cuda.current_stream(self.device).wait_stream(side)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def free_memory(self) -> int | None:
        return torch.cuda.mem_get_info(self.device)[0]
# ANCHOR_END: cuda_graph_backend


class CPUGraphBackend(GraphBackend):
    name = "cpu-recording"
    records_aten_ops = True

    def new_graph(self) -> CPUGraph:
        return CPUGraph()

    def capture(self, graph: CPUGraph, pool: Any):
        return cpu_graph(graph, pool=pool)


def graph_backend_for(device: torch.device | str) -> GraphBackend:
    device = torch.device(device)
    if device.type == "cuda":
        return CUDAGraphBackend(device)
    if device.type == "cpu":
        return CPUGraphBackend()
    raise ValueError(f"no graph backend for device type {device.type!r}; use 'cuda' or 'cpu'")
