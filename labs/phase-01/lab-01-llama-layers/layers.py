"""Phase 01, lab 01 — the layers of a Llama (your code).

Mirrors four files of mini_vllm, one idea each:
- layers/layernorm.py        `RMSNorm` (with the residual add folded in)
- layers/rotary_embedding.py `rope_inverse_frequencies`, `RotaryEmbedding`
- attention/contiguous.py    `ContiguousAttentionBackend` (KV write + grouped-query attention)
- layers/activation.py       `SiluAndMul` (SwiGLU's gate)

The tests check each against a formula, then put all four into mini_vllm's `tiny`
Llama and compare its logits with the untouched model's.
Run: pytest labs/phase-01/lab-01-llama-layers
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mini_vllm.attention.backend import AttentionBackend
from mini_vllm.attention.contiguous import (
    ContiguousAttentionMetadata,
    allocate_contiguous_kv_caches,
)  # given
from mini_vllm.config.compilation import AttentionCGSupport

# -- RMSNorm --------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x / sqrt(mean(x^2 over the last dim) + eps) * weight.

        With `residual`: first x = x + residual, and return (normalised x, x): the sum
        is the new residual stream. Compute the statistics in float32 and return the
        input's dtype.
        """
        raise NotImplementedError(
            "TODO: (add the residual), mean of squares in float32, rsqrt, times weight"
        )


# -- RoPE -----------------------------------------------------------------------------


def rope_inverse_frequencies(
    rotary_dim: int, base: float, scaling: dict[str, Any] | None = None
) -> torch.Tensor:
    """The rotation speed of each channel pair: base **
    (-2i / rotary_dim) for i < rotary_dim / 2, float32.

    (`scaling`, Llama 3.1's long-context rescaling, is not part of this lab.)
    """
    if scaling is not None:
        raise NotImplementedError("RoPE scaling is not part of this lab")
    raise NotImplementedError("TODO: one line with torch.arange")


class RotaryEmbedding(nn.Module):
    """Given: the cos/sin tables, one row per position. Yours: `forward`."""

    def __init__(
        self,
        head_dim: int,
        max_position: int,
        base: float,
        is_neox_style: bool = True,
        scaling: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.max_position = max_position
        self.is_neox_style = is_neox_style
        self.base = base
        self.scaling = scaling

    def tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Given: cos and sin of position * frequency,
        each `[max_position, head_dim // 2]`, float32."""
        if not hasattr(self, "_tables"):
            inv_freq = rope_inverse_frequencies(self.head_dim, self.base, self.scaling)
            angles = torch.outer(torch.arange(self.max_position, dtype=torch.float32), inv_freq)
            self._tables = (angles.cos(), angles.sin())
        return self._tables

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate `query` `[T, H*D]` and `key` `[T, Hkv*D]` by `positions` `[T]`; same shapes back.

        Every token has its own position (the flattened batch mixes sequences). Pair i
        of a head turns by the angle positions * inv_freq[i]:
            (a, b) -> (a cos - b sin, b cos + a sin)
        where, with D = head_dim,
        - rotate-half (is_neox_style=True, Hugging Face Llama): a = channel i, b = channel i + D/2;
        - interleaved (is_neox_style=False, llama.cpp):         a = channel 2i, b = channel 2i + 1.
        """
        raise NotImplementedError("TODO: gather the table rows, view as heads, rotate the pairs")


# -- grouped-query attention over a contiguous KV cache -------------------------------


class ContiguousAttentionBackend(AttentionBackend):
    """Cache layout per layer: `[2, batch, max_len,
    num_kv_heads, head_dim]` (0: keys, 1: values)."""

    name = "contiguous"
    cudagraph_support = AttentionCGSupport.NEVER

    def __init__(self, scale: float | None = None) -> None:
        self.scale = scale  # None: 1 / sqrt(head_dim)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: ContiguousAttentionMetadata,
    ) -> torch.Tensor:
        """q `[T, H, D]`, k and v `[T, Hkv, D]` with T =
        batch * num_new_tokens (sequence by sequence).

        1. Refuse (ValueError) a step whose end (start_pos + num_new_tokens) is past the cache.
        2. Write k and v into positions [start_pos, start_pos + num_new_tokens) of every
           sequence; touch nothing else.
        3. Attend each new query over the sequence's cached keys 0 .. its own position
           (causal): query head h reads KV head h // (H // Hkv), without copying the
           cache once per query head.
        Return `[T, H, D]`.
        """
        raise NotImplementedError("TODO: check, write the cache, then grouped attention")


# -- SwiGLU ---------------------------------------------------------------------------


class SiluAndMul(nn.Module):
    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        """`[..., 2 * I]` (gate and up side by side) -> silu(gate) * up, `[..., I]`."""
        raise NotImplementedError("TODO")


_GIVEN = (F, allocate_contiguous_kv_caches)  # imported for you; use them or not
