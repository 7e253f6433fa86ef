"""CUDAGraphWrapper: capture a callable once per batch descriptor, replay it afterwards.

vLLM counterpart: vllm/compilation/cuda_graph.py (`CUDAGraphWrapper`, `CUDAGraphEntry`).
The behaviour follows `CUDAGraphWrapper.__call__`:
- the wrapper's runtime mode (FULL or PIECEWISE) is fixed when it is built;
- each call reads the forward context; if the step's runtime mode is NONE or not the
  wrapper's own, it simply calls through. That rule is what lets wrappers nest: a FULL
  wrapper around a model whose pieces have PIECEWISE wrappers, exactly one level acts;
- otherwise the entry for the step's `BatchDescriptor` is replayed, or, the first time
  and only while the capture window is open, captured;
- a replay returns the very same output object every time;
- it does no warm-up and copies no inputs: the caller passes views of persistent
  buffers (the model runner's job). In debug mode it checks that the input addresses
  are those of the capture, the one mistake that otherwise fails silently;
- every wrapper of an engine captures into one shared memory pool.
It works with `torch.cuda.CUDAGraph` on a GPU and with the CPU recording graph
(mini_vllm/compilation/cpu_graph.py) elsewhere, through a `GraphBackend`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import torch

from mini_vllm.compilation.graph_backend import GraphBackend
from mini_vllm.compilation.monitor import validate_cudagraph_capturing_enabled
from mini_vllm.config.compilation import CUDAGraphMode
from mini_vllm.forward_context import BatchDescriptor, get_forward_context

__all__ = ["CUDAGraphEntry", "CUDAGraphWrapper", "GraphCounters"]


@dataclass
class CUDAGraphEntry:
    batch_descriptor: BatchDescriptor
    graph: Any = None
    output: Any = None
    input_addresses: list[int] = field(default_factory=list)
    num_replays: int = 0


@dataclass
class GraphCounters:
    """Shared by all wrappers of one engine: what was captured and replayed."""

    captured: int = 0
    replayed: int = 0


def _tensor_addresses(args: tuple) -> list[int]:
    return [x.data_ptr() for x in args if isinstance(x, torch.Tensor)]


class CUDAGraphWrapper:
    # ANCHOR: wrapper_init
    def __init__(
        self,
        runnable: Callable[..., Any],
        runtime_mode: CUDAGraphMode,
        backend: GraphBackend,
        pool: Any = None,
        *,
        name: str = "",
        debug: bool = False,
        counters: GraphCounters | None = None,
        gc_disable: bool = False,
    ) -> None:
        if runtime_mode not in (CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE):
            raise ValueError(
                f"a CUDAGraphWrapper captures FULL or PIECEWISE graphs, not {runtime_mode.name}"
            )
        self.runnable = runnable
        self.runtime_mode = runtime_mode
        self.backend = backend
        self.pool = pool
        self.name = name or getattr(runnable, "__name__", type(runnable).__name__)
        self.debug = debug
        self.counters = counters if counters is not None else GraphCounters()
        # Piecewise models capture one graph per piece and per size: collecting
        # garbage before each of them would make capture crawl, so every piece but
        # the first skips it (vLLM's CUDAGraphOptions.gc_disable).
        self.gc_disable = gc_disable
        self.entries: dict[BatchDescriptor, CUDAGraphEntry] = {}

    # ANCHOR_END: wrapper_init

    def __repr__(self) -> str:
        return (
            f"CUDAGraphWrapper({self.name}, {self.runtime_mode.name}, {len(self.entries)} graphs)"
        )

    # ANCHOR: wrapper_call
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        context = get_forward_context()
        mode, descriptor = context.cudagraph_runtime_mode, context.batch_descriptor
        if mode is CUDAGraphMode.NONE or mode is not self.runtime_mode:
            return self.runnable(*args, **kwargs)  # not this level's business: call through
        if descriptor is None:
            raise RuntimeError(
                f"{self}: runtime mode {mode.name} needs a batch descriptor in the forward context"
            )
        entry = self.entries.get(descriptor)
        if entry is None:
            return self._capture(descriptor, args, kwargs)
        if self.debug:
            addresses = _tensor_addresses(args)
            if addresses != entry.input_addresses:
                raise RuntimeError(
                    f"{self}: input addresses changed since the capture of {descriptor} "
                    f"(captured {entry.input_addresses}, got {addresses}); the graph would read "
                    "stale data. Pass views of the persistent input buffers"
                )
        entry.graph.replay()
        entry.num_replays += 1
        self.counters.replayed += 1
        return entry.output

    # ANCHOR_END: wrapper_call

    # ANCHOR: wrapper_capture
    def _capture(self, descriptor: BatchDescriptor, args: tuple, kwargs: dict) -> Any:
        validate_cudagraph_capturing_enabled(
            f"a {self.runtime_mode.name} graph of {self.name} for {descriptor}"
        )
        entry = CUDAGraphEntry(descriptor, input_addresses=_tensor_addresses(args))
        patches = []
        if self.gc_disable:
            patches = [mock.patch("gc.collect", lambda *a, **k: 0)]
            if torch.cuda.is_available():
                patches.append(mock.patch("torch.cuda.empty_cache", lambda: None))
        for patch in patches:
            patch.start()
        try:
            entry.graph, entry.output = self.backend.capture(self.runnable, args, kwargs, self.pool)
        finally:
            for patch in reversed(patches):
                patch.stop()
        self.entries[descriptor] = entry
        self.counters.captured += 1
        return entry.output

    # ANCHOR_END: wrapper_capture
