"""Put the graph wrappers around a model: PIECEWISE around the pieces, FULL around the whole.

vLLM counterpart: vllm/compilation/backends.py (`VllmBackend.__call__`: split the
Dynamo graph, compile each piece, and replace each piece in the split module by a
`PiecewiseBackend` wrapped in a PIECEWISE `CUDAGraphWrapper`) and
vllm/v1/worker/gpu_model_runner.py (`load_model`: the FULL wrapper around the model
when the mode has full graphs).

`build_graph_forward` returns the callable the model runner calls instead of the bare
model: for NONE the model itself; for a mode with piecewise graphs a split module whose
pieces are wrapped; for a mode with full graphs a FULL wrapper around whichever of the
two. Both wrappers can be present (FULL_AND_PIECEWISE): the forward context's runtime
mode decides, each step, which level replays.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from mini_vllm.compilation.cuda_graph import CUDAGraphWrapper, GraphCounters
from mini_vllm.compilation.decorators import TorchCompileWrapper
from mini_vllm.compilation.graph_backend import GraphBackend
from mini_vllm.compilation.piecewise_backend import (
    CompileStats,
    ModelPieces,
    PiecewiseCompileBackend,
)
from mini_vllm.compilation.split import (
    SplitItem,
    is_attention_node,
    split_graph,
    trace_with_opaque_attention,
)
from mini_vllm.config.compilation import CompilationMode, CUDAGraphMode

__all__ = ["GraphForward", "build_graph_forward"]


@dataclass
class GraphForward:
    """The runner's forward, and handles on what was built (for statistics and tests)."""

    forward: Callable[..., Any]
    counters: GraphCounters = field(default_factory=GraphCounters)
    full_wrapper: CUDAGraphWrapper | None = None
    # With torch.compile the pieces exist only once Dynamo has traced the model.
    pieces: ModelPieces = field(default_factory=lambda: ModelPieces(None))
    compile_stats: CompileStats | None = None  # set when the model is compiled
    compiler: TorchCompileWrapper | None = None
    fusion: bool = False  # the fusion pass runs on the compiled graph

    @property
    def piece_wrappers(self) -> list[CUDAGraphWrapper]:
        return self.pieces.wrappers

    @property
    def split_items(self) -> list[SplitItem]:
        return self.pieces.split_items

    @property
    def num_captured_graphs(self) -> int:
        return sum(len(w.entries) for w in self._wrappers())

    def release_graphs(self) -> None:
        """Drop every captured graph (before the process group its collectives use goes:
        NCCL does not tear a communicator down while graphs that captured it exist)."""
        for wrapper in self._wrappers():
            wrapper.entries.clear()

    def _wrappers(self) -> list[CUDAGraphWrapper]:
        return self.piece_wrappers + ([self.full_wrapper] if self.full_wrapper else [])


# ANCHOR: build_graph_forward
def build_graph_forward(
    model: torch.nn.Module,
    mode: CUDAGraphMode,
    backend: GraphBackend,
    *,
    pool: Any = None,
    debug: bool = False,
    compilation_mode: CompilationMode = CompilationMode.NONE,
    fusion: bool | None = None,
) -> GraphForward:
    """Wrap `model` (a module whose forward takes input_ids and positions) for `mode`.

    Without compilation the pieces come from torch.fx (attention kept opaque); with
    VLLM_COMPILE they come from Dynamo's trace, split and compiled by the piecewise
    backend at the first call; with the other compile levels there are no pieces.
    `fusion` (VLLM_COMPILE only) runs mini_vllm/compilation/passes/fusion.py; None: on for CUDA,
    where its fused kernels exist.
    """
    counters = GraphCounters()
    pieces = ModelPieces(backend if mode.requires_piecewise_compilation() else None, pool, counters)
    result = GraphForward(model, counters, pieces=pieces)
    forward: Callable[..., Any] = model
    TorchCompileWrapper.detach(model)  # whatever an earlier engine attached to this model
    if compilation_mode is not CompilationMode.NONE:
        stats = CompileStats()
        piece_backend = None
        if compilation_mode is CompilationMode.VLLM_COMPILE:
            result.fusion = backend.name == "cuda" if fusion is None else fusion
            piece_backend = PiecewiseCompileBackend(pieces, stats, fusion=result.fusion)
        result.compiler = TorchCompileWrapper(model, compilation_mode, piece_backend, stats)
        result.compile_stats = stats
    elif mode.requires_piecewise_compilation():
        # ANCHOR: fx_pieces
        traced = trace_with_opaque_attention(model)
        split, pieces.split_items = split_graph(traced, is_attention_node(traced))
        for item in pieces.split_items:
            if not item.is_splitting_graph:  # attention stays eager: it sees each step's metadata
                pieces.install(split, item.submod_name, item.module)
        forward = split
        # ANCHOR_END: fx_pieces
    # ANCHOR: full_wrapper
    if mode.has_full_cudagraphs():
        result.full_wrapper = CUDAGraphWrapper(
            forward,
            CUDAGraphMode.FULL,
            backend,
            pool,
            name=f"{type(model).__name__} (full)",
            debug=debug,
            counters=counters,
        )
        forward = result.full_wrapper
    result.forward = forward
    return result
    # ANCHOR_END: full_wrapper


# ANCHOR_END: build_graph_forward
