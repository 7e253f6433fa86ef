"""Cut a traced model at its attention calls: the pieces between them can be captured.

vLLM counterpart: vllm/compilation/backends.py (`split_graph`, `SplitItem`), which cuts
the FX graph Dynamo traced at every "splitting op" (the attention custom op) with
torch.fx's `split_module`. Each splitting op becomes a piece of its own that runs
eagerly; the pieces between are compiled and wrapped in PIECEWISE CUDA-graph wrappers.
No piece is empty and the order is kept, so k attention calls give at most k + 1
captured pieces.

Without torch.compile, mini_vllm gets the FX graph from `torch.fx.symbolic_trace`
with the `Attention` layer kept as one opaque call (a leaf module), and each CustomOp
layer too, so that it still picks its kernel when the piece runs; with
torch.compile (CompilationMode.VLLM_COMPILE) the graph comes from Dynamo and the
attention is the `mini_vllm::attention` custom op. The split is the same code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.fx
from torch.fx.passes.split_module import split_module

from mini_vllm.layers.attention import Attention
from mini_vllm.layers.custom_op import CustomOp

__all__ = ["SplitItem", "is_attention_node", "split_graph", "trace_with_opaque_attention"]


@dataclass(frozen=True)
class SplitItem:
    submod_name: str
    graph_id: int
    is_splitting_graph: bool  # True: an attention call, run eagerly
    module: torch.nn.Module


OPAQUE_LAYERS = (Attention, CustomOp)


class _OpaqueAttentionTracer(torch.fx.Tracer):
    """Traces everything but the Attention layers and the CustomOp layers, which stay
    single call_module nodes. Attention is where the graph is cut; a CustomOp layer picks
    its implementation when it runs (mini_vllm/layers/custom_op.py), so a piece run or
    captured from the graph uses the same kernels as the model run directly, which an
    op-by-op copy of `forward_native` would not."""

    def is_leaf_module(self, module: torch.nn.Module, qualified_name: str) -> bool:
        return isinstance(module, OPAQUE_LAYERS) or super().is_leaf_module(module, qualified_name)


def trace_with_opaque_attention(model: torch.nn.Module) -> torch.fx.GraphModule:
    """An FX graph of `model.forward` in which each Attention layer is one node."""
    graph = _OpaqueAttentionTracer().trace(model)
    return torch.fx.GraphModule(model, graph, class_name=f"Traced{type(model).__name__}")


def is_attention_node(gm: torch.fx.GraphModule) -> Callable[[torch.fx.Node], bool]:
    """The splitting-op test for graphs from `trace_with_opaque_attention` and from Dynamo."""

    def test(node: torch.fx.Node) -> bool:
        if node.op == "call_module":
            return isinstance(gm.get_submodule(node.target), Attention)
        if node.op == "call_function":
            return getattr(node.target, "name", lambda: "")() in ("mini_vllm::attention",) or (
                str(node.target).startswith("mini_vllm.attention")
            )
        return False

    return test


# ANCHOR: split_graph
def split_graph(
    gm: torch.fx.GraphModule, is_splitting_node: Callable[[torch.fx.Node], bool]
) -> tuple[torch.fx.GraphModule, list[SplitItem]]:
    """Give every splitting node a piece of its own and group the nodes between them."""
    piece_of: dict[torch.fx.Node, int] = {}
    splitting_pieces: set[int] = set()
    piece = 0
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if is_splitting_node(node):
            piece += 1  # close the piece before it (if any node went there)
            piece_of[node] = piece
            splitting_pieces.add(piece)
            piece += 1  # and start a new one after it
        else:
            piece_of[node] = piece
    split = split_module(gm, None, lambda node: piece_of[node], keep_original_order=True)
    items = []
    for name, module in split.named_children():
        if not name.startswith("submod_"):
            continue
        graph_id = int(name.removeprefix("submod_"))
        items.append(SplitItem(name, graph_id, graph_id in splitting_pieces, module))
    items.sort(key=lambda item: item.graph_id)
    return split, items


# ANCHOR_END: split_graph
