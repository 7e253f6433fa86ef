"""Phase 05, lab 06 — cut a traced model at its attention calls (your code).

The course's version of `split_graph` and `SplitItem` in vLLM's
vllm/compilation/backends.py. vLLM cuts the FX graph Dynamo
traced at every "splitting op" (`CompilationConfig.splitting_ops` in
vllm/config/compilation.py, attention by default). Each splitting op ends up alone in
a piece that runs eagerly; the pieces between them hold no attention, so each can be
compiled and captured as a PIECEWISE CUDA graph.
Run: pytest labs/phase-05/lab-06-piecewise-split

The graphs you cut come in two forms, and one predicate must recognise both:
- from `torch.fx` (`trace_with_opaque_attention`, step 1): every `Attention` layer
  stays one `call_module` node;
- from Dynamo (torch.compile with mini_vllm's piecewise backend): every attention is
  one `call_function` node whose target is the custom op `mini_vllm::attention`
  (registered in mini_vllm/compilation/attention_op.py), either the packet
  `torch.ops.mini_vllm.attention` or its overload `torch.ops.mini_vllm.attention.default`.

PyTorch gives the tool that cuts a graph into child modules:
`torch.fx.passes.split_module.split_module` (read its docstring).
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
    graph_id: int  # the number the split gave the nodes of this piece
    is_splitting_graph: bool  # True: this piece is one attention call, run eagerly
    module: torch.nn.Module  # the child module itself


# -- step 1 -----------------------------------------------------------------------------


def trace_with_opaque_attention(model: torch.nn.Module) -> torch.fx.GraphModule:
    """An FX graph of `model.forward` in which every `Attention` layer is one call_module node.

    Guarantees:
    - the returned object is a `torch.fx.GraphModule` whose graph reaches the model's own
      parameters and layers by their qualified names (no copy of the weights);
    - its `call_module` nodes are exactly the `Attention` layers, one node each, in
      forward order; everything else the model does (embedding, linear layers, norms,
      rotary embedding, MLP) appears as the functions and methods it runs;
    - it computes what `model(input_ids, positions)` computes, for any batch (prefill,
      decode or mixed) under any forward context: nothing about one batch is baked in.

    Example: for mini_vllm's `tiny` Llama (2 layers), `model.model` traces to a graph with
    2 call_module nodes, targets `layers.0.self_attn.attn` and `layers.1.self_attn.attn`,
    and about 126 call_function/call_method nodes around them.
    """
    raise NotImplementedError("TODO: an FX trace whose only opaque modules are Attention layers")


# -- step 2 -----------------------------------------------------------------------------


def is_attention_node(gm: torch.fx.GraphModule) -> Callable[[torch.fx.Node], bool]:
    """The splitting-op test: a function that says whether a node of `gm` is an attention call.

    The returned predicate is True for
    - a `call_module` node whose module (in `gm`) is an `Attention` layer;
    - a `call_function` node whose target is the `mini_vllm::attention` op, as the
      packet or as an overload;
    and False for every other node of any kind.

    Example: over a graph `x -> add -> attention.default(...) -> attention(...) -> add`,
    the verdicts for the four calls are False, True, True, False.
    """
    raise NotImplementedError("TODO: return a predicate over the nodes of gm")


# -- step 3 -----------------------------------------------------------------------------


def split_graph(
    gm: torch.fx.GraphModule, is_splitting_node: Callable[[torch.fx.Node], bool]
) -> tuple[torch.fx.GraphModule, list[SplitItem]]:
    """Cut `gm` so that every splitting node is alone in its piece; return (split module, pieces).

    Guarantees:
    - the split module is a GraphModule whose `submod_<n>` children are the pieces, and
      calling it computes exactly what `gm` computes (the same nodes run, in the same
      order: the outputs are equal bit for bit);
    - every splitting node is alone in a piece (`is_splitting_graph=True`); every other
      piece holds no splitting node and at least one node of work (no empty piece);
    - the pieces keep the graph's order: nodes of a piece with a smaller graph_id come
      earlier in `gm`. The ids grow strictly but need not be consecutive;
    - the list holds one `SplitItem` per `submod_<n>` child, in graph order
      (`submod_name == f"submod_{graph_id}"`, `module` is that very child).

    Example: compute nodes `a, A1, b, c, A2, A3, d` (A = splitting) give six pieces,
    `[a] [A1] [b c] [A2] [A3] [d]`, flagged False, True, False, True, True, False.
    """
    raise NotImplementedError("TODO: one piece per splitting node, one per run of nodes between")
