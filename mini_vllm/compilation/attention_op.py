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

The op takes the layer's *name*, a string, not the layer: the layer's KV cache and
backend are found in a registry at run time, as vLLM looks them up in the forward
context. It returns nothing and writes its result into `output`, which the model
allocated before the op: that buffer belongs to the piece before the split, so under
piecewise CUDA graphs it has a fixed address (see mini_vllm/layers/attention.py).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import torch

from mini_vllm.forward_context import get_forward_context
from mini_vllm.layers.rotary_embedding import apply_deferred_rope

if TYPE_CHECKING:
    from mini_vllm.layers.attention import Attention

__all__ = ["attention_layer_registry", "register_attention_layers"]

_LAYERS: dict[str, "Attention"] = {}
_model_ids = itertools.count()


def attention_layer_registry() -> dict[str, "Attention"]:
    return _LAYERS


def register_attention_layers(model: torch.nn.Module) -> list[str]:
    """Give every Attention layer of `model` a unique name the custom op can find it by."""
    from mini_vllm.layers.attention import attention_layers

    prefix = f"model{next(_model_ids)}"
    names = []
    for layer in attention_layers(model):
        layer.layer_name = f"{prefix}.layers.{layer.layer_idx}.attn"
        _LAYERS[layer.layer_name] = layer
        names.append(layer.layer_name)
    return names


# ANCHOR: custom_op
@torch.library.custom_op("mini_vllm::attention", mutates_args=("output",))
def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, output: torch.Tensor, layer_name: str
) -> None:
    """q `[T, H*D]`, k and v `[T, Hkv*D]`; writes attention `[T, H*D]` into `output`."""
    _run_layer(_LAYERS[layer_name], q, k, v, output)


def _run_layer(layer: "Attention", q, k, v, output, rope=None) -> None:
    metadata = get_forward_context().attn_metadata
    num_tokens = q.shape[0]
    if rope is not None and not layer.impl.accepts_rope:
        q, k = apply_deferred_rope(rope, q, k)
        rope = None
    target = output.view(num_tokens, layer.num_heads, layer.head_dim)
    out = layer.impl.forward(
        q.view(num_tokens, layer.num_heads, layer.head_dim),
        k.view(num_tokens, layer.num_kv_heads, layer.head_dim),
        v.view(num_tokens, layer.num_kv_heads, layer.head_dim),
        layer.kv_cache,
        metadata,
        **({"output": target} if layer.impl.accepts_output else {}),
        **({"rope": rope} if rope is not None else {}),
    )
    if out is not target:  # the backend did not write in place
        target.copy_(out)


@attention.register_fake
def _attention_fake(q, k, v, output, layer_name):
    # Shapes are all the compiler needs: the op changes `output` in place and returns nothing.
    return None
# ANCHOR_END: custom_op


# ANCHOR: attention_with_rope
@torch.library.custom_op("mini_vllm::attention_with_rope", mutates_args=("output",))
def attention_with_rope(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, output: torch.Tensor, layer_name: str,
    positions: torch.Tensor, cos_sin_cache: torch.Tensor,
) -> None:
    """`mini_vllm::attention` of q and k rotated by neox RoPE: what the fusion pass puts in
    place of `rotary_embedding` then `attention`. A backend that can rotate inside its
    kernel (`accepts_rope`) gets q and k unrotated; any other gets them rotated first."""
    _run_layer(_LAYERS[layer_name], q, k, v, output, rope=(positions, cos_sin_cache))


@attention_with_rope.register_fake
def _attention_with_rope_fake(q, k, v, output, layer_name, positions, cos_sin_cache):
    return None
# ANCHOR_END: attention_with_rope
