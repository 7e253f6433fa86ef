"""The torch.compile backend of CompilationMode.VLLM_COMPILE:
split at attention, Inductor per piece.

vLLM counterpart: vllm/compilation/backends.py (`VllmBackend.__call__`, which splits the
graph Dynamo traced with `split_graph`, then runs `PiecewiseCompileInterpreter` over the
split module with fake tensors: every piece that is not a splitting op is compiled by
Inductor for the symbolic token count and replaced by a `PiecewiseBackend` wrapped in a
PIECEWISE `CUDAGraphWrapper`).

Dynamo hands the backend one FX graph of the whole forward, in which each attention is
a single `mini_vllm::attention` node, and example inputs that are fake tensors whose
first dimension is the symbol for the number of tokens. The backend:
0. with fusion on, folds each norm and SwiGLU activation into the product after it and
   RoPE into attention (mini_vllm/compilation/passes/fusion.py; vLLM runs its fusion
   passes inside Inductor);
1. splits the graph at the attention nodes (k attention calls -> at most k + 1 pieces);
2. runs the split module on the fake inputs, so that each piece sees fake inputs of the
   right (symbolic) shapes, and compiles each non-attention piece with Inductor right
   there: one compilation per piece, valid for every token count;
3. wraps each compiled piece in a PIECEWISE CUDA-graph wrapper (when the engine uses
   piecewise graphs), which captures per batch descriptor later.
Identical pieces (every middle layer looks the same to Inductor) hit Inductor's FX-graph
cache, so a 30-layer model compiles little more than three distinct pieces.

Under an AOT compile (mini_vllm/compilation/caching/aot_cache.py) each piece is compiled as a
standalone artifact and the backend returns a `CompiledSplitModel` that torch can save;
a later start loads it and `adopt` installs its pieces without tracing or compiling.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from mini_vllm import compat
from mini_vllm.compilation.caching.aot_cache import CompiledSplitModel
from mini_vllm.compilation.cuda_graph import CUDAGraphWrapper, GraphCounters
from mini_vllm.compilation.graph_backend import GraphBackend
from mini_vllm.compilation.passes.fusion import run_fusion_passes
from mini_vllm.compilation.split import SplitItem, is_attention_node, split_graph
from mini_vllm.config.compilation import CUDAGraphMode

__all__ = ["CompileStats", "PiecewiseCompileBackend", "inductor_compile"]


@dataclass
class CompileStats:
    """What compilation did; shared by every backend call of one model."""

    dynamo_graphs: int = 0  # times Dynamo handed a graph to the backend (1 + recompiles)
    compiled_pieces: int = 0  # Inductor compilations (pieces; 1 per graph without a split)
    fused_pairs: int = 0  # op pairs the fusion passes replaced by one op
    seconds: float = 0.0  # wall time spent in the backend (Inductor included)
    graph: torch.fx.GraphModule | None = None  # the last graph Dynamo traced (for diagnostics)


# ANCHOR: model_pieces
class ModelPieces:
    """The pieces of one split model and the PIECEWISE graph wrappers around them.

    Both ways of cutting a model (torch.fx without compilation, Dynamo with it) install
    their pieces here, so the rule is written once: each capturable piece is replaced,
    inside the split module, by a PIECEWISE `CUDAGraphWrapper` of it (or left as it is
    when the engine has no piecewise graphs), in piece order (vLLM:
    `PiecewiseCompileInterpreter.call_module` in vllm/compilation/backends.py).
    """

    def __init__(
        self,
        graph_backend: GraphBackend | None,
        pool: Any = None,
        counters: GraphCounters | None = None,
    ) -> None:
        self.graph_backend = graph_backend  # None: no piecewise graphs
        self.pool = pool
        self.counters = counters if counters is not None else GraphCounters()
        self.split_items: list[SplitItem] = []
        self.wrappers: list[CUDAGraphWrapper] = []

    # ANCHOR: pieces_install
    def install(
        self, split_module: torch.fx.GraphModule, name: str, runnable: Callable[..., Any]
    ) -> None:
        if self.graph_backend is not None:
            # Collecting garbage before each capture would make a piecewise capture crawl
            # (one graph per piece and size): only the first piece does it (vLLM's gc_disable).
            runnable = CUDAGraphWrapper(
                runnable,
                CUDAGraphMode.PIECEWISE,
                self.graph_backend,
                self.pool,
                name=name,
                counters=self.counters,
                gc_disable=bool(self.wrappers),
            )
            self.wrappers.append(runnable)
        # Bypass nn.Module.__setattr__: the split module's
        # generated forward calls the piece by name.
        split_module.__dict__[name] = runnable

    # ANCHOR_END: pieces_install


# ANCHOR_END: model_pieces


class CompiledPiece:
    """A piece compiled by Inductor (it says so, for the CPU graph backend's choice of graph)."""

    runs_compiled_code = True

    def __init__(self, compiled: Callable[..., Any], name: str) -> None:
        self.compiled = compiled
        self.__name__ = name

    def __call__(self, *args: Any) -> Any:
        return self.compiled(*args)


# ANCHOR: inductor_config
# Inductor's pattern matcher rewrites `residual + linear(x)` as one `addmm`. cuBLAS then
# first copies the residual into the output buffer, one more node in the graph, twice a
# layer; left alone, the add fuses into the RMSNorm kernel that reads the sum anyway. The
# model has no other pattern to match (no biases, attention is an opaque op), so the
# matcher is off for our pieces: the compiled step is faster without it
# (benchmarks/results/decode-graphs-cuda-step-by-step.md).
INDUCTOR_CONFIG = {"pattern_matcher": False}
# ANCHOR_END: inductor_config


def inductor_compile(gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
    return compat.inductor_compile(gm, example_inputs, INDUCTOR_CONFIG)


def standalone_compile(gm: torch.fx.GraphModule, example_inputs: list) -> tuple[Any, bytes]:
    """Inductor on one piece, as an artifact that can be saved: (callable, its bytes).

    vLLM counterpart: `InductorStandaloneAdaptor.compile` in
    vllm/compilation/compiler_interface.py. "from_graph": the piece keeps the symbolic
    token count Dynamo gave it, so one artifact serves every batch size.
    """
    import pickle

    compiled = compat.standalone_compile(gm, example_inputs, INDUCTOR_CONFIG)
    return compiled, pickle.dumps(compiled.serialize())


class _PieceCompiler(torch.fx.Interpreter):
    """Runs the split module on fake inputs and compiles each piece on the way."""

    def __init__(
        self,
        split_module: torch.fx.GraphModule,
        compile_piece: Callable[[str, torch.fx.GraphModule, tuple], None],
    ):
        super().__init__(split_module)
        self.compile_piece = compile_piece

    def call_module(self, target, args, kwargs):
        piece = self.module.get_submodule(target)
        outputs = piece(*args, **kwargs)  # fake outputs: the next piece's fake inputs
        self.compile_piece(target, piece, args)
        return outputs


# ANCHOR: piecewise_backend
class PiecewiseCompileBackend:
    """`torch.compile(..., backend=PiecewiseCompileBackend(...))` for VLLM_COMPILE."""

    def __init__(
        self, pieces: ModelPieces, stats: CompileStats | None = None, fusion: bool = False
    ) -> None:
        self.pieces = pieces
        self.stats = stats if stats is not None else CompileStats()
        self.fusion = fusion  # run the fusion passes (compilation/passes/fusion.py)
        # Set by the compile wrapper for an AOT compile: each piece is compiled as a
        # standalone artifact and the result can be saved (compilation/caching/aot_cache.py).
        self.serializable = False

    @property
    def uses_custom_ops(self) -> bool:
        """The fusion passes match the layers' custom ops: the compile wrapper reads this
        and traces the model emitting them (mini_vllm/layers/custom_op.py)."""
        return self.fusion

    # ANCHOR: backend_call
    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        start = time.perf_counter()
        self.stats.dynamo_graphs += 1
        if self.fusion:
            self.stats.fused_pairs += run_fusion_passes(gm)
        self.stats.graph = gm
        split, items = split_graph(gm, is_attention_node(gm))
        self.pieces.split_items = items
        to_compile = {item.submod_name for item in items if not item.is_splitting_graph}
        artifacts: dict[str, bytes] = {}
        returns_tuple: dict[str, bool] = {}

        # ANCHOR: compile_piece
        def compile_piece(name: str, module: torch.fx.GraphModule, args: tuple) -> None:
            if name not in to_compile:
                return  # attention: stays the opaque eager op
            self.stats.compiled_pieces += 1
            if self.serializable:
                returns_tuple[name] = compat.graph_returns_tuple(module)
                # Called in this process, the artifact returns what the graph returns.
                runnable, artifacts[name] = standalone_compile(module, list(args))
            else:
                runnable = inductor_compile(module, list(args))
            self.pieces.install(split, name, CompiledPiece(runnable, name))

        # ANCHOR_END: compile_piece

        # Dynamo hands over the parameters as the real tensors and the inputs as fake
        # ones; run the pieces entirely on fake tensors (no real compute, symbolic sizes).
        # The Python dispatcher lets the meta functions see symbolic sizes (Dynamo has it
        # on around its backend call, an AOT compile does not).
        fake_context, fake_inputs = compat.fake_tensor_context(example_inputs)
        with fake_context:
            _PieceCompiler(split, compile_piece).run(*fake_inputs)
        # ANCHOR_END: backend_call
        self.stats.seconds += time.perf_counter() - start
        if not self.serializable:
            return split
        return CompiledSplitModel(
            split,
            gm,
            artifacts,
            returns_tuple,
            {item.submod_name: item.is_splitting_graph for item in items},
            self.stats.fused_pairs,
        )

    def forget_pieces(self) -> None:
        """Drop what a failed compile installed, before compiling again."""
        self.pieces.wrappers.clear()
        self.pieces.split_items = []
        self.stats.compiled_pieces = 0
        self.stats.dynamo_graphs = 0
        self.stats.fused_pairs = 0

    # ANCHOR: adopt
    def adopt(self, saved: CompiledSplitModel) -> None:
        """Install the pieces of a compiled model loaded from disk, as `__call__` would have."""
        self.stats.graph = saved.dynamo_graph
        self.stats.fused_pairs = saved.fused_pairs
        split = saved.split
        self.pieces.split_items = [
            SplitItem(name, index, is_splitting, split.get_submodule(name))
            for index, (name, is_splitting) in enumerate(saved.splitting.items())
        ]
        for name, runnable in saved.loaded.items():
            self.stats.compiled_pieces += 1
            self.pieces.install(split, name, CompiledPiece(runnable, name))

    # ANCHOR_END: adopt


# ANCHOR_END: piecewise_backend
