"""Phase 01, lab 01 — the layers of a Llama (your code).

Mirrors four files of mini_vllm, one idea each:
- layers/layernorm.py        `RMSNorm` (with the residual add folded in)
- layers/rotary_embedding.py `rope_inverse_frequencies`, `RotaryEmbedding`
- attention/contiguous.py    `ContiguousAttentionBackend` (KV write + grouped-query attention)
- layers/activation.py       `SiluAndMul` (SwiGLU's gate)

The tests check each against a formula, in float32 and in half precision, then put all
four into mini_vllm's `tiny` Llama and compare its logits with the untouched model's.
Each TODO's docstring says what the function must guarantee, with one example, not how;
the README has the steps, their predictions, their test commands and folded hints.
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
        """Each row of x (its last dimension) divided by its root mean square, times weight.

        Guarantees:
        - out = x / sqrt(mean(x^2) + eps) * weight, row by row, in x's shape and dtype
          (the weight has x's dtype).
        - A float16 or bfloat16 x gives what float32 statistics give, rounded to x's
          dtype: activations of a few hundred neither overflow nor vanish.
        - With `residual` (x's shape and dtype): h = x + residual, in x's dtype, is what
          gets normalised, and the pair (normalised h, h) comes back; h is the new
          residual stream.
        - x and residual hold exactly what they held before the call (the decoder layer
          keeps using them).

        Example: eps = 1.0, weight all ones, x = [[1.0] * 8]: mean(x^2) = 1, so every
        output is 1 / sqrt(2) = 0.7071.
        """
        raise NotImplementedError("TODO: step 1")


# -- RoPE -----------------------------------------------------------------------------


def rope_inverse_frequencies(
    rotary_dim: int, base: float, scaling: dict[str, Any] | None = None
) -> torch.Tensor:
    """The rotation speed of each channel pair, `[rotary_dim // 2]`, in float32.

    Entry i is base ** (-2i / rotary_dim): pair 0 turns by one radian per position,
    the last pair almost not at all. Example: rotary_dim 4, base 100 -> [1.0, 0.1].
    (`scaling`, Llama 3.1's long-context rescaling, is not part of this lab.)
    """
    if scaling is not None:
        raise NotImplementedError("RoPE scaling is not part of this lab")
    raise NotImplementedError("TODO: step 2")


class RotaryEmbedding(nn.Module):
    """Given: `__init__` and its table of cos and sin. Yours: `forward` (step 3).

    `cos_sin_cache` `[max_position, 2, 1, width]`, float32: for position p, with
    c_i = cos(p * inv_freq[i]) and s_i = sin(p * inv_freq[i]), i < head_dim / 2,
    - rotate-half (is_neox_style=True): row 0 is [c | c] and row 1 is [-s | s]
      (width = head_dim: the halves side by side);
    - interleaved (is_neox_style=False): row 0 is c and row 1 is s (width = head_dim / 2).
    The size-1 axis broadcasts over heads. Using the table is up to you.
    """

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
        inv_freq = rope_inverse_frequencies(head_dim, base, scaling)
        angles = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
        cos, sin = angles.cos(), angles.sin()
        if is_neox_style:
            table = torch.stack((torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1)), dim=1)
        else:
            table = torch.stack((cos, sin), dim=1)
        self.register_buffer("cos_sin_cache", table.unsqueeze(2), persistent=False)

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`query` `[T, H*D]` and `key` `[T, Hkv*D]` rotated by `positions` `[T]`.

        Guarantees:
        - Every token turns by its own position (a flattened batch mixes sequences), and
          every head of a token by the same angles: pair i turns by
          theta = position * inv_freq[i], (a, b) -> (a cos theta - b sin theta,
          b cos theta + a sin theta), where, with D = head_dim,
          rotate-half (is_neox_style=True, Hugging Face Llama): a = channel i, b = i + D/2;
          interleaved (is_neox_style=False, llama.cpp): a = channel 2i, b = channel 2i + 1.
        - The angle is right at every position below max_position, whatever the dtype of
          query and key.
        - Two new tensors come back, with the shapes and dtype of query and key, within
          that dtype's rounding of the exact rotation; query and key are left as they were.

        Example: D = 2 (one pair, inv_freq [1.0]), a query head [1.0, 0.0] at position
        p comes back as [cos p, sin p]; at position 0 nothing changes.
        """
        raise NotImplementedError("TODO: step 3")


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
        """Attention of the step's new tokens over their sequences' cache: `[T, H, D]`.

        q `[T, H, D]`, k and v `[T, Hkv, D]`, T = batch * num_new_tokens, rows sequence
        by sequence (row b * n + t is token t of sequence b), all in the cache's dtype;
        `metadata` says the new tokens sit at positions [start_pos, start_pos +
        num_new_tokens) of every sequence.
        - Errors: ValueError if the step ends past the cache's length; a step that ends
          exactly at it is fine.
        - The cache: afterwards, `kv_cache[0, b, p]` and `kv_cache[1, b, p]` hold the key
          and value of sequence b's token at position p for every new position; no other
          entry of the cache changes.
        - The output, in q's dtype: a query at position p attends over its own sequence's
          keys and values at positions 0..p (causal), with scale `self.scale` (None:
          1/sqrt(D)); the H / Hkv consecutive query heads of a group read one KV head
          (Hugging Face's `repeat_kv` order), and the cache is not copied once per query
          head.
        - q, k and v hold exactly what they held before the call.

        Example: H = 4, Hkv = 2: query heads 0 and 1 read KV head 0, heads 2 and 3 read
        KV head 1.
        """
        raise NotImplementedError("TODO: step 4")


# -- SwiGLU ---------------------------------------------------------------------------


class SiluAndMul(nn.Module):
    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        """`[..., 2 * I]` (gate, then up, side by side) -> silu(gate) * up, `[..., I]`.

        silu(g) = g * sigmoid(g). The result has gate_up's dtype, and gate_up holds
        exactly what it held before the call.

        Example: [[0.0, 2.0, 5.0, 7.0]] (gate [0, 2], up [5, 7]) -> [[0.0, 2 * sigmoid(2) * 7]]
        = [[0.0, 12.33]].
        """
        raise NotImplementedError("TODO: step 5")


_GIVEN = (F, allocate_contiguous_kv_caches)  # imported for you; use them or not
