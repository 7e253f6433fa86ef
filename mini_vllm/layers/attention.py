"""The model's attention layer: a thin, pluggable seam between the model and a backend.

vLLM counterpart: vllm/attention/layer.py (`Attention.forward`, which reads the
forward context and calls `self.impl.forward(...)` with `self.kv_cache`) and
vllm/v1/worker/utils.py (`bind_kv_cache`). nano-vllm: nanovllm/layers/attention.py.

The layer owns no weights and knows nothing about the cache layout. Whoever allocates
the KV cache binds, to every layer, the cache tensor and the backend object that
knows how to use it; each step's metadata (where the new tokens go, how long each
sequence is) arrives through `get_forward_context().attn_metadata`, so the model's
forward signature never changes when the backend does. This is also the seam where
later phases split the model for piecewise CUDA graphs and torch.compile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from mini_vllm.errors import UserError
from mini_vllm.forward_context import get_forward_context

if TYPE_CHECKING:
    from mini_vllm.attention.backend import AttentionBackend

__all__ = ["Attention", "attention_layers", "bind_kv_caches", "static_forward_context"]


class Attention(nn.Module):
    def __init__(
        self, layer_idx: int, num_heads: int, num_kv_heads: int, head_dim: int, scale: float
    ) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        if num_heads % num_kv_heads:  # grouped-query attention: whole groups of query heads
            raise UserError(
                f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
            )
        # Plain attributes, not buffers: the cache belongs to whoever allocated it
        # and must not travel with the model's state_dict or `.to()`.
        self.kv_cache: torch.Tensor | None = None
        self.impl: AttentionBackend | None = None
        # Under torch.compile the layer calls the opaque `mini_vllm::attention` op by
        # name instead of its backend directly (mini_vllm/compilation/attention_op.py);
        # the op finds the layer by that name in the forward context.
        self.use_custom_op = False
        self.layer_name = f"layers.{layer_idx}.attn"

    # ANCHOR: attention_layer_forward
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, output: torch.Tensor | None = None
    ) -> torch.Tensor:
        """q `[T, H*D]`, k and v `[T, Hkv*D]` -> `[T, H*D]`.

        With `output` (a `[T, H*D]` tensor the caller allocated), the result is written
        into it and `output` itself is returned. Piecewise CUDA graphs need this: the
        graph piece after attention reads its input from a fixed address, so attention,
        which runs eagerly between pieces, must write where the piece before it
        allocated (vLLM's `unified_attention_with_output` does the same).
        """
        if self.impl is None:
            raise RuntimeError(
                f"attention layer {self.layer_idx} has no backend: allocate a KV cache and "
                "call bind_kv_caches(model, backend, kv_caches) before running the model"
            )
        if self.use_custom_op:
            if output is None:
                raise RuntimeError(
                    "the compiled attention op writes into an output buffer; pass `output`"
                )
            torch.ops.mini_vllm.attention(q, k, v, output, self.layer_name)
            return output
        return self.run_backend(q, k, v, output)

    def run_backend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        output: torch.Tensor | None = None,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The backend's attention over this layer's KV cache, with the step's metadata from
        the forward context (what the compiled op calls too). `rope` (positions, table),
        for a backend that `accepts_rope`: q and k still need rotating, and its kernel
        does it (the fusion of RoPE into attention, mini_vllm/kernels/fused_ops.py)."""
        context = get_forward_context()
        num_tokens = q.shape[0]
        if context.skip_attention:  # a dummy run: nobody reads what attention computes
            if output is None:
                return q.new_zeros(num_tokens, self.num_heads * self.head_dim)
            return output.zero_()
        metadata = context.attn_metadata
        if metadata is None:
            raise RuntimeError(
                f"attention layer {self.layer_idx} found no attention metadata in the forward "
                "context: pass attn_metadata= to set_forward_context (the model runner builds it "
                "from the batch)"
            )
        target = (
            output.view(num_tokens, self.num_heads, self.head_dim) if output is not None else None
        )
        out = self.impl.forward(
            q.view(num_tokens, self.num_heads, self.head_dim),
            k.view(num_tokens, self.num_kv_heads, self.head_dim),
            v.view(num_tokens, self.num_kv_heads, self.head_dim),
            self.kv_cache,
            metadata,
            **({"output": target} if target is not None and self.impl.accepts_output else {}),
            **({"rope": rope} if rope is not None else {}),
        )
        if output is None:
            return out.reshape(num_tokens, self.num_heads * self.head_dim)
        if out is not target:  # the backend did not write in place
            target.copy_(out)
        return output

    # ANCHOR_END: attention_layer_forward

    def extra_repr(self) -> str:
        return (
            f"layer_idx={self.layer_idx}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, scale={self.scale:.4g}"
        )


def attention_layers(model: nn.Module) -> list[Attention]:
    """The model's Attention layers, in layer order."""
    return sorted(
        (m for m in model.modules() if isinstance(m, Attention)), key=lambda m: m.layer_idx
    )


def static_forward_context(model: nn.Module) -> dict[str, Attention]:
    """The model's Attention layers by `layer_name`: what a forward context carries so that
    the attention op can find its layer (vLLM: `CompilationConfig.static_forward_context`).

    Made once and kept on the model itself (walking the modules costs a few hundred
    microseconds, too much for every step); it goes away with the model.
    """
    layers = model.__dict__.get("_static_forward_context")
    if layers is None:
        layers = model.__dict__["_static_forward_context"] = {
            a.layer_name: a for a in attention_layers(model)
        }
    return layers


# ANCHOR: bind_kv_caches
def bind_kv_caches(
    model: nn.Module, backend: AttentionBackend | None, kv_caches: list[torch.Tensor] | None
) -> None:
    """Give every Attention layer its backend and its own cache tensor, layer by layer.

    Passing `None` for both unbinds (frees the references to the cache).
    """
    layers = attention_layers(model)
    if kv_caches is None:
        kv_caches = [None] * len(layers)
    if len(kv_caches) != len(layers):
        raise ValueError(
            f"got {len(kv_caches)} KV cache tensors for {len(layers)} attention layers"
        )
    for layer, cache in zip(layers, kv_caches):
        layer.impl = backend
        layer.kv_cache = cache


# ANCHOR_END: bind_kv_caches
