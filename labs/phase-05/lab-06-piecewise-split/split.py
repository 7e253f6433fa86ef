"""Phase 05, lab 06 — cut a traced model at its attention calls (your code).

Mirrors mini_vllm/compilation/split.py, the course's version of `split_graph` and
`SplitItem` in vLLM's vllm/compilation/backends.py. vLLM cuts the FX graph Dynamo
traced at every "splitting op" (`CompilationConfig.splitting_ops` in
vllm/config/compilation.py, attention by default). Each splitting op ends up alone in
a piece that runs eagerly; the pieces between them hold no attention, so each can be
compiled and captured as a PIECEWISE CUDA graph.
Run: pytest labs/phase-05/lab-06-piecewise-split

The graphs you cut come in two forms, and one predicate must recognise both:
- from `torch.fx` (`trace_with_opaque_attention`, step 1): every `Attention` layer
  stays one `call_module` node, because the tracer treats it as a leaf;
- from Dynamo (torch.compile with mini_vllm's piecewise backend): every attention is
  one `call_function` node whose target is the custom op `mini_vllm::attention`
  (mini_vllm/compilation/attention_op.py), either the packet
  `torch.ops.mini_vllm.attention` or its overload `torch.ops.mini_vllm.attention.default`.

The tool that does the cutting is given by PyTorch:
`torch.fx.passes.split_module.split_module(gm, None, piece_of, keep_original_order=True)`
calls `piece_of(node)` for every node that is not a placeholder or the output, puts
the nodes with the same number into one child module named `submod_<number>`, and
returns a parent GraphModule that calls the children in order, passing each the values
it needs. It creates no child for a number that no node got.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.fx
from torch.fx.passes.split_module import split_module  # noqa: F401  (you will need it)

from mini_vllm.layers.attention import Attention  # noqa: F401  (the layer that must stay opaque)

ATTENTION_OP = "mini_vllm::attention"  # given: the custom op's qualified name


@dataclass(frozen=True)
class SplitItem:
    """Given: one piece of the split graph (vLLM's `SplitItem`, whose last field is `graph`)."""

    submod_name: str  # the child's name in the split module: "submod_<graph_id>"
    graph_id: int  # the number your `piece_of` gave its nodes
    is_splitting_graph: bool  # True: this piece is one attention call, run eagerly
    module: torch.nn.Module  # the child module itself


# -- step 1 -----------------------------------------------------------------------------


def trace_with_opaque_attention(model: torch.nn.Module) -> torch.fx.GraphModule:
    """An FX graph of `model.forward` in which every `Attention` layer is one call_module node.

    `torch.fx.symbolic_trace` would trace *into* attention, whose work depends on
    per-step Python metadata (the prefill/decode path, sequence lengths): the graph
    would be wrong for the next batch. A tracer decides what stays opaque through its
    `is_leaf_module(module, qualified_name)` method. Everything else (the linear
    layers, norms, rotary embedding) must be traced through, as usual.

    Return a `torch.fx.GraphModule(model, graph)`, so the graph's nodes can still
    reach the model's parameters and layers by name.
    """
    raise NotImplementedError(
        "TODO: a torch.fx.Tracer whose leaves are the Attention layers (plus the default ones)"
    )


# -- step 2 -----------------------------------------------------------------------------


def is_attention_node(gm: torch.fx.GraphModule) -> Callable[[torch.fx.Node], bool]:
    """The splitting-op test: a function that says whether a node of `gm` is an attention call.

    True for
    - a `call_module` node whose module (`gm.get_submodule(node.target)`) is an
      `Attention` layer;
    - a `call_function` node whose target is the `mini_vllm::attention` op, as the
      packet or as an overload.
    False for every other node: placeholders, the output, other modules (a linear
    layer), other functions, even ones with "attention" in their name (PyTorch's own
    `scaled_dot_product_attention` is not a split point).
    """
    raise NotImplementedError("TODO: return a predicate over the nodes of gm")


# -- step 3 -----------------------------------------------------------------------------


def split_graph(
    gm: torch.fx.GraphModule, is_splitting_node: Callable[[torch.fx.Node], bool]
) -> tuple[torch.fx.GraphModule, list[SplitItem]]:
    """Cut `gm` so that every splitting node is alone in its piece; return (split module, pieces).

    - Walk `gm.graph.nodes` in order and give each node (placeholders and the output
      excepted) a piece number. A splitting node gets a number of its own; the nodes
      between two splitting nodes share one number. Numbers only grow, so the pieces
      keep the graph's order.
    - No piece is empty: k splitting nodes give at most k + 1 pieces between them
      (exactly k + 1 in a model where something runs before, between and after them).
    - Hand the numbering to `split_module(..., keep_original_order=True)`.
    - Return one `SplitItem` per `submod_<n>` child of the split module, sorted by
      graph_id as a number (as strings, "submod_10" sorts before "submod_2").
    """
    raise NotImplementedError("TODO: number the nodes, split_module, one SplitItem per piece")
