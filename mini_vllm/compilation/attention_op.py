"""Attention as one opaque custom op, `mini_vllm::attention`, so that the compiler cuts there.

vLLM counterpart: vllm/attention/layer.py (`unified_attention_with_output`, registered
with `direct_register_custom_op` as `torch.ops.vllm.unified_attention_with_output`,
and its fake implementation) and vllm/forward_context.py (`no_compile_layers`, where
the op finds its layer by name).

Why an op: Dynamo would otherwise trace into attention, whose work depends on per-step
Python metadata (sequence lengths, the prefill/decode path), and would either
specialise on it (a recompile per batch composition) or break the graph. As a custom
op, attention is one node Dynamo does not look into. The node is then where the
piecewise backend splits the graph (mini_vllm/compilation/split.py).

The op takes the layer's *name*, a string, not the layer (a compiled graph can hold a
string, not a module): at run time it finds the layer, with its KV cache and backend,
in the current forward context (`no_compile_layers`, filled by whoever runs the model:
the model runner, from `static_forward_context(model)`), as vLLM does. Nothing global
keeps a layer, so a dropped engine takes its KV cache with it. The op returns nothing
and writes its result into `output`, which the model allocated before the op: that
buffer belongs to the piece before the split, so under piecewise CUDA graphs it has a
fixed address (see mini_vllm/layers/attention.py). With the fusion passes on, the same
op with RoPE folded in, `mini_vllm::attention_with_rope`, lives with the kernels
(mini_vllm/kernels/fused_ops.py).
"""

from __future__ import annotations

import torch

from mini_vllm.forward_context import get_forward_context
from mini_vllm.layers.attention import Attention, attention_layers
from mini_vllm.torch_utils import direct_register_custom_op

__all__ = ["attention", "find_layer", "use_attention_op"]


def use_attention_op(model: torch.nn.Module, enabled: bool = True) -> None:
    """Route every Attention layer of `model` through the opaque op (what a compile needs)
    or, with `enabled=False`, back to calling its backend directly."""
    for layer in attention_layers(model):
        layer.use_custom_op = enabled


def find_layer(layer_name: str) -> Attention:
    """The Attention layer named `layer_name` in the current forward context."""
    layers = get_forward_context().no_compile_layers
    if layer_name not in layers:
        raise RuntimeError(
            f"the attention op looked for layer {layer_name!r} in the forward context and did "
            f"not find it ({len(layers)} layer(s) there): run the model through the model runner, "
            "or pass no_compile_layers=static_forward_context(model) to set_forward_context"
        )
    return layers[layer_name]


# ANCHOR: custom_op
def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, output: torch.Tensor, layer_name: str
) -> None:
    """q `[T, H*D]`, k and v `[T, Hkv*D]`; writes attention `[T, H*D]` into `output`."""
    find_layer(layer_name).run_backend(q, k, v, output)


def _attention_fake(q, k, v, output, layer_name):
    # Shapes are all the compiler needs: the op changes `output` in place and returns nothing.
    return None


direct_register_custom_op(
    "attention", attention, mutates_args=["output"], fake_impl=_attention_fake
)


# ANCHOR_END: custom_op
