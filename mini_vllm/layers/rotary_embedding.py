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

Which implementation runs is `CustomOp`'s choice: the torch version for compilers and
on CPU, one in-place Triton kernel eagerly on CUDA (mini_vllm/layers/rope_triton.py).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from mini_vllm.layers.custom_op import CustomOp
from mini_vllm.layers.rope_triton import triton_rope_, triton_rope_available
from mini_vllm.torch_utils import direct_register_custom_op

__all__ = [
    "RotaryEmbedding",
    "apply_deferred_rope",
    "rope_inverse_frequencies",
    "rotary_embedding_op",
]


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


class RotaryEmbedding(CustomOp):
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
            # Per position, two rows: [cos | cos] and [-sin | sin], see `_rotate`.
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
        return self._rotate_query_and_key(positions, query, key, eager=False)

    def forward_cpu(self, positions, query, key):
        return self._rotate_query_and_key(positions, query, key, eager=True)

    def forward_cuda(self, positions, query, key):
        if self.is_neox_style and triton_rope_available(query, key, self.cos_sin_cache):
            # One Triton kernel rotating q and k in place, instead of five torch ops
            # (vLLM: forward_cuda, the in-place CUDA kernel).
            return triton_rope_(positions, query, key, self.cos_sin_cache)
        return self.forward_cpu(positions, query, key)

    def forward_custom_op(self, positions, query, key):
        if not self.is_neox_style:
            return self.forward_native(positions, query, key)
        # Compiling for the fusion passes: one node, which the pass folds into attention.
        return tuple(
            torch.ops.mini_vllm.rotary_embedding(positions, query, key, self.cos_sin_cache)
        )

    def _rotate_query_and_key(self, positions, query, key, eager: bool):
        num_tokens = positions.shape[0]
        cos_sin = self.cos_sin_cache.index_select(0, positions)
        # Eagerly, a cast to the same dtype is skipped, not made a no-op call: at batch 1
        # every op costs microseconds. (A tracer cannot branch on a dtype: it records the cast.)
        if not eager or cos_sin.dtype != query.dtype:
            cos_sin = cos_sin.to(query.dtype)
        # Query and key heads side by side, rotated in one go: half the ops.
        cos, sin = cos_sin.unbind(1)
        heads = _heads_side_by_side(query, key, self.head_dim, allow_view=eager)
        rotated = self._rotate(heads, cos, sin)
        return rotated.view(num_tokens, -1).split([query.shape[-1], key.shape[-1]], dim=1)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x `[T, heads, D]`; cos and sin `[T, 1, width]` (rows of the table)."""
        if self.is_neox_style:
            # Channel i pairs with i + D/2: out = (x1 cos - x2 sin, x2 cos + x1 sin).
            # roll(x, D/2) is (x2, x1), so out = x * [cos|cos] + roll(x) * [-sin|sin]:
            # three ops. At batch 1 on CPU, each op costs microseconds of overhead
            # whatever its size, so fewer ops is what makes this faster.
            return torch.addcmul(x * cos, x.roll(self.head_dim // 2, dims=-1), sin)
        # Interleaved (GPT-J / llama.cpp): channel 2i pairs with 2i + 1.
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)

    # ANCHOR_END: rope

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, max_position={self.max_position}, "
            f"is_neox_style={self.is_neox_style}"
        )


def rotary_embedding_op(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style RoPE of query `[T, H*D]` and key `[T, Hkv*D]` with a RotaryEmbedding's table.

    vLLM: `torch.ops._C.rotary_embedding` (csrc/pos_encoding_kernels.cu). The fusion pass
    (mini_vllm/compilation/fusion.py) folds it into the attention after it.
    """
    head_dim = cos_sin_cache.shape[-1]
    cos, sin = cos_sin_cache.index_select(0, positions).to(query.dtype).unbind(1)
    heads = _heads_side_by_side(query, key, head_dim, allow_view=True)
    rotated = torch.addcmul(heads * cos, heads.roll(head_dim // 2, dims=-1), sin).flatten(1)
    q_rot, k_rot = rotated.split([query.shape[-1], key.shape[-1]], dim=1)
    return q_rot.clone(), k_rot.clone()  # a custom op's outputs never share its inputs' storage


def _rotary_embedding_fake(positions, query, key, cos_sin_cache):
    return query.new_empty(query.shape), key.new_empty(key.shape)


direct_register_custom_op("rotary_embedding", rotary_embedding_op, fake_impl=_rotary_embedding_fake)


def apply_deferred_rope(
    rope: tuple[torch.Tensor, torch.Tensor], query: torch.Tensor, key: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k (`[T, ...]`, any head layout) by a fused attention op's `rope`
    (positions, table): for the attention paths that have no kernel rotating them."""
    positions, table = rope
    num_tokens = query.shape[0]
    q_rot, k_rot = rotary_embedding_op(
        positions, query.reshape(num_tokens, -1), key.reshape(num_tokens, -1), table
    )
    return q_rot.view(query.shape), k_rot.view(key.shape)


def _heads_side_by_side(
    query: torch.Tensor, key: torch.Tensor, head_dim: int, allow_view: bool
) -> torch.Tensor:
    """query `[T, Hq*D]` and key `[T, Hk*D]` as one `[T, Hq+Hk, D]` tensor.

    In a Llama layer q and k are neighbouring columns of the fused qkv output, so the
    pair already is one strided block of memory: viewing it costs nothing, where a
    concatenation copies both (and is one more op per layer). Anything else is copied,
    and so is everything a tracer sees (`allow_view` False): the test of the addresses
    cannot be recorded.
    """
    num_tokens = query.shape[0]
    if (
        allow_view
        and query.dim() == 2
        and key.dim() == 2
        and query.stride(1) == 1
        and key.stride(1) == 1
        and query.stride(0) == key.stride(0)
        and key.untyped_storage().data_ptr() == query.untyped_storage().data_ptr()
        and key.storage_offset() == query.storage_offset() + query.shape[1]
    ):
        num_heads = (query.shape[1] + key.shape[1]) // head_dim
        return query.as_strided((num_tokens, num_heads, head_dim), (query.stride(0), head_dim, 1))
    return torch.cat(
        (query.view(num_tokens, -1, head_dim), key.view(num_tokens, -1, head_dim)), dim=1
    )
