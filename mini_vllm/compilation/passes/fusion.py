"""Compile-time fusion passes: fold a norm or an activation
into the product after it, RoPE into attention.

vLLM counterpart: vllm/compilation/fusion.py (`RMSNormQuantFusionPass`) and
vllm/compilation/activation_quant_fusion.py (`ActivationQuantFusionPass`), run by
vllm/compilation/pass_manager.py (`PostGradPassManager`) inside Inductor, switched by
`PassConfig` fields. They find `rms_norm` / `fused_add_rms_norm` / `silu_and_mul`
custom-op nodes followed by a quantisation node with Inductor's pattern matcher and
replace each pair by one fused op.

mini_vllm's pass does the same for the product itself, on the graph Dynamo traced,
before the piecewise backend splits it (so a fused pair never straddles a piece):

    getitem(fused_add_rms_norm(x, r, g, eps), 0) -> linear(., W)
        becomes  fused_add_rms_norm_linear(x, r, g, eps, W)      (and its new residual)
    rms_norm(x, g, eps) -> linear(., W)  becomes  rms_norm_linear(x, g, eps, W)
    silu_and_mul(x) -> linear(., W)      becomes  silu_and_mul_linear(x, W)

A pair is fused only when the product is the norm's (or activation's) only reader:
otherwise the unfused output would still have to be computed. In a Llama layer that is
three pairs: input norm and qkv, post-attention norm and gate_up, SwiGLU and down.

A second pass folds RoPE into the attention op that reads the rotated q and k:

    rotary_embedding(pos, q, k, table) -> attention(q', k', v, out, name)
        becomes  attention_with_rope(q, k, v, out, name, pos, table)

The decode kernels then rotate q and the new key as they load them (vLLM's
`QKNormRoPEFusionPass`, vllm/compilation/qk_norm_rope_fusion.py, folds RoPE into the
kernel next to it in the same spirit: the per-head q/k norm of models that have one).
Attention stays the splitting op, so the piece boundaries do not move.

The ops exist in the graph only when the model was traced emitting them
(`emit_custom_ops`, mini_vllm/layers/custom_op.py), which the compile wrapper does for a
backend that runs these passes, and only for the layers whose kernels are on (the
`custom_ops` switch, mini_vllm/_custom_ops.py); the ops and the fused ops are registered
with the kernels (mini_vllm/kernels/fused_ops.py). Together: four kernels fewer per Llama
layer at batch 1.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
import torch.fx

from mini_vllm import _custom_ops as ops
from mini_vllm import compat

__all__ = [
    "FUSIONS",
    "fuse_norm_and_act_into_linear",
    "fuse_rope_into_attention",
    "op_name",
    "run_fusion_passes",
]

# producer op -> (fused op, number of outputs of the producer)
FUSIONS = {
    "mini_vllm::rms_norm": ("rms_norm_linear", 1),
    "mini_vllm::fused_add_rms_norm": ("fused_add_rms_norm_linear", 2),
    "mini_vllm::silu_and_mul": ("silu_and_mul_linear", 1),
}


def op_name(node: torch.fx.Node) -> str | None:
    """'namespace::op' of a call to a torch.ops operator (overload or packet), else None."""
    if node.op != "call_function":
        return None
    return compat.qualified_op_name(node.target)


def _outputs(node: torch.fx.Node, count: int) -> list[torch.fx.Node | None] | None:
    """The nodes reading each output of `node` (getitems for a tuple), or None if unusual."""
    if count == 1:
        return [node]
    outputs: list[torch.fx.Node | None] = [None] * count
    for user in node.users:
        if user.target is not operator.getitem or outputs[user.args[1]] is not None:
            return None
        outputs[user.args[1]] = user
    return outputs


def _rewrite_each(
    gm: torch.fx.GraphModule, rewrite: Callable[[torch.fx.Graph, torch.fx.Node], bool]
) -> int:
    """Offer every node (of the graph as it was) to `rewrite`, which fuses it with its
    neighbour in place or returns False; then check and regenerate the module. The count
    of rewrites is returned."""
    graph = gm.graph
    fused_count = sum(1 for node in list(graph.nodes) if rewrite(graph, node))
    graph.lint()
    gm.recompile()
    return fused_count


# ANCHOR: fusion_pass
def fuse_norm_and_act_into_linear(gm: torch.fx.GraphModule) -> int:
    """Rewrite `gm` in place; returns the number of pairs fused."""
    position = {node: i for i, node in enumerate(gm.graph.nodes)}

    def fuse(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
        fusion = FUSIONS.get(op_name(node))
        if fusion is None:
            return False
        fused_name, count = fusion
        outputs = _outputs(node, count)
        if outputs is None or outputs[0] is None or len(outputs[0].users) != 1:
            return False
        product = next(iter(outputs[0].users))
        if op_name(product) != "mini_vllm::linear" or product.args[0] is not outputs[0]:
            return False
        weight = product.args[1]
        if isinstance(weight, torch.fx.Node) and position[weight] > position[node]:
            return False  # the weight is computed later (never in our models): leave it
        with graph.inserting_before(node):
            fused = graph.call_function(
                getattr(torch.ops.mini_vllm, fused_name).default, (*node.args, weight)
            )
            fused_outputs = (
                [fused]
                if count == 1
                else [graph.call_function(operator.getitem, (fused, i)) for i in range(count)]
            )
        product.replace_all_uses_with(fused_outputs[0])
        graph.erase_node(product)
        for old, new in zip(outputs[1:], fused_outputs[1:]):
            if old is not None:
                old.replace_all_uses_with(new)
        for old in reversed(outputs):
            if old is not None and old is not node:
                graph.erase_node(old)
        graph.erase_node(node)
        return True

    return _rewrite_each(gm, fuse)


# ANCHOR_END: fusion_pass


# ANCHOR: rope_fusion_pass
def fuse_rope_into_attention(gm: torch.fx.GraphModule) -> int:
    """Rewrite `gm` in place; returns the number of rotary + attention pairs fused."""

    def fuse(graph: torch.fx.Graph, rotary: torch.fx.Node) -> bool:
        if op_name(rotary) != "mini_vllm::rotary_embedding":
            return False
        outputs = _outputs(rotary, 2)
        if outputs is None or None in outputs:
            return False
        q_rot, k_rot = outputs
        attention = [u for u in q_rot.users if op_name(u) == "mini_vllm::attention"]
        if len(attention) != 1 or attention[0].args[:2] != (q_rot, k_rot) or len(k_rot.users) != 1:
            return False
        attention = attention[0]
        # Other readers of the rotated q may only want its shape (the output buffer is
        # `empty_like(q)`): the unrotated q has the same one.
        shape_only = [u for u in q_rot.users if u is not attention]
        if any(u.target is not torch.empty_like for u in shape_only):
            return False
        positions, query, key, table = rotary.args
        for user in shape_only:
            user.replace_input_with(q_rot, query)
        with graph.inserting_before(attention):
            fused = graph.call_function(
                torch.ops.mini_vllm.attention_with_rope.default,
                (query, key, *attention.args[2:], positions, table),
            )
        attention.replace_all_uses_with(fused)
        for node in (attention, k_rot, q_rot, rotary):
            graph.erase_node(node)
        return True

    return _rewrite_each(gm, fuse)


# ANCHOR_END: rope_fusion_pass


def run_fusion_passes(gm: torch.fx.GraphModule) -> int:
    """Both passes; the number of op pairs replaced by one op."""
    ops.require_kernels("the fusion passes")  # the fused ops are theirs
    if not compat.op_names_resolve():
        raise RuntimeError(
            f"the fusion passes find ops by name, which torch {torch.__version__} no longer "
            "gives the way mini_vllm/compat.py reads it: turn fusion off (enable_fusion=False)"
        )
    return fuse_norm_and_act_into_linear(gm) + fuse_rope_into_attention(gm)
