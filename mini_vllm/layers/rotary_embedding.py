"""Rotary position embeddings (RoPE), applied by each token's position.

vLLM counterpart: vllm/model_executor/layers/rotary_embedding.py (`RotaryEmbedding`,
`_compute_cos_sin_cache`, `Llama3RotaryEmbedding`, `get_rope`); Hugging Face:
transformers/models/llama/modeling_llama.py (`LlamaRotaryEmbedding`, `rotate_half`,
`apply_rotary_pos_emb`) and transformers/modeling_rope_utils.py
(`_compute_llama3_parameters`).

RoPE turns each pair of channels of a query or key into a 2-D vector and rotates it
by `position * freq_i`. A query at position m and a key at position n then meet in
the dot product as a rotation by (m - n): attention sees relative positions only.

Which channels form a pair is a layout choice:
- neox / rotate-half (Hugging Face Llama, vLLM's default ``is_neox_style=True``):
  channel i pairs with channel i + d/2;
- interleaved / GPT-J (llama.cpp): channel 2i pairs with 2i + 1.
llama.cpp's converter permutes the rows of W_q and W_k so that its interleaved RoPE
computes the same thing; see mini_vllm/weights/gguf_file.py.

Because positions come in as a tensor, the flattened batch may mix sequences at
different positions: each token looks up its own row of the cos/sin table.

`forward_native` is the whole layer. Where the kernel table is on
(mini_vllm/_custom_ops.py), a neox-style layer runs one in-place Triton kernel on CUDA
(mini_vllm/kernels/rotary_embedding.py) and on the CPU the same arithmetic in fewer ops
(mini_vllm/kernels/cpu.py).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from mini_vllm import _custom_ops as ops
from mini_vllm.layers.custom_op import CustomOp

__all__ = ["RotaryEmbedding", "rope_inverse_frequencies", "rotate_neox"]


# ANCHOR: inv_freq
def rope_inverse_frequencies(
    rotary_dim: int, base: float, scaling: dict[str, Any] | None = None
) -> torch.Tensor:
    """The rotation speed of each channel pair, in float32 (`[rotary_dim // 2]`)."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).to(torch.float32) / rotary_dim
    inv_freq = 1.0 / (base**exponents)
    if scaling is not None:
        inv_freq = _llama3_rescale(inv_freq, scaling)
    return inv_freq


# ANCHOR_END: inv_freq


def _llama3_rescale(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1's long-context rule: slow down the low frequencies, keep the high ones.

    Wavelengths longer than the original context / low_freq_factor are divided by
    `factor`; shorter than original / high_freq_factor are kept; in between the two
    are blended linearly in (original context / wavelength).
    """
    factor = float(scaling["factor"])
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    original = float(scaling.get("original_max_position_embeddings", 8192))
    wavelength = 2 * math.pi / inv_freq
    slowed = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    blend = (original / wavelength - low) / (high - low)
    blended = (1 - blend) * slowed / factor + blend * slowed
    in_between = (wavelength >= original / high) & (wavelength <= original / low)
    return torch.where(in_between, blended, slowed)


# ANCHOR: rotate_neox
def rotate_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox RoPE of heads `x` `[..., D]` with table rows cos = [cos|cos], sin = [-sin|sin].

    Channel i pairs with i + D/2: out = (x1 cos - x2 sin, x2 cos + x1 sin). roll(x, D/2)
    is (x2, x1), so out = x * [cos|cos] + roll(x) * [-sin|sin]: three ops.
    """
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin)


# ANCHOR_END: rotate_neox


class RotaryEmbedding(CustomOp):
    name = "rotary_embedding"

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
        # ANCHOR: rope_table
        inv_freq = rope_inverse_frequencies(head_dim, base, scaling)
        angles = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
        cos, sin = angles.cos(), angles.sin()
        if is_neox_style:
            # Per position, two rows: [cos | cos] and [-sin | sin], see `rotate_neox`.
            table = torch.stack((torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1)), dim=1)
        else:
            table = torch.stack((cos, sin), dim=1)
        # A forward gathers rows; it computes no trigonometry. Kept in float32 (cast
        # per use) so that bf16 models index the very same angles. The size-1 axis
        # broadcasts over heads: [max_position, 2, 1, width].
        self.register_buffer("cos_sin_cache", table.unsqueeze(2), persistent=False)
        # ANCHOR_END: rope_table

    # ANCHOR: rope
    def forward_native(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate `query` `[T, H*D]` and `key` `[T, Hkv*D]` by `positions` `[T]`."""
        num_tokens = positions.shape[0]
        cos, sin = self.cos_sin_cache.index_select(0, positions).to(query.dtype).unbind(1)
        # Query and key heads side by side, rotated in one go: half the ops.
        heads = torch.cat(
            (
                query.view(num_tokens, -1, self.head_dim),
                key.view(num_tokens, -1, self.head_dim),
            ),
            dim=1,
        )
        rotated = self._rotate(heads, cos, sin)
        return rotated.view(num_tokens, -1).split([query.shape[-1], key.shape[-1]], dim=1)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x `[T, heads, D]`; cos and sin `[T, 1, width]` (rows of the table)."""
        if self.is_neox_style:
            return rotate_neox(x, cos, sin)
        # Interleaved (GPT-J / llama.cpp): channel 2i pairs with 2i + 1.
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)

    # ANCHOR_END: rope

    def forward_cuda(self, positions, query, key):
        if not self.is_neox_style:  # the kernels rotate neox pairs only
            return self.forward_native(positions, query, key)
        # One kernel rotating q and k in place instead of five ops (vLLM: forward_cuda).
        return ops.rotary_embedding(positions, query, key, self.cos_sin_cache)

    forward_cpu = forward_cuda  # the native arithmetic in fewer ops

    def forward_custom_op(self, positions, query, key):
        if not self.is_neox_style:
            return self.forward_native(positions, query, key)
        # Traced for the fusion passes: one node, which the pass folds into attention.
        return ops.rotary_embedding_op(positions, query, key, self.cos_sin_cache)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, max_position={self.max_position}, "
            f"is_neox_style={self.is_neox_style}"
        )
