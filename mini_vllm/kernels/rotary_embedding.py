"""Neox-style RoPE of the query and key heads as one Triton kernel, in place (CUDA only).

vLLM counterpart: the in-place `rotary_embedding` CUDA kernel of
csrc/pos_encoding_kernels.cu, which `RotaryEmbedding.forward_cuda` in
vllm/model_executor/layers/rotary_embedding/base.py calls; `forward_native` is the torch
version, and under torch.compile Inductor makes its own kernel of that.

Why: written in torch, the rotation is a gather of the position's cos/sin rows, a cast,
and three element-wise ops: five kernels a layer, each costing the host a launch, for a
few kilobytes of work. Eagerly that is what a decode step waits for. Here one program a
token reads its position's two table rows once and rotates every query and key head.

The arithmetic matches `rotate_neox` (mini_vllm/layers/rotary_embedding.py) op for op:
the table row is rounded to the activations' dtype, `x * [cos|cos]` is rounded, then
`roll(x, D/2) * [-sin|sin]` is added in float32 and the sum rounded, as `torch.addcmul`
does.
"""

from __future__ import annotations

import torch

from mini_vllm.kernels import cpu
from mini_vllm.kernels.launch import launch, next_power_of_2

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU machines: the torch version is used
    triton = None

__all__ = [
    "apply_deferred_rope",
    "rotary_embedding_cuda",
    "triton_rope_",
    "triton_rope_available",
]


def triton_rope_available(query: torch.Tensor, key: torch.Tensor, table: torch.Tensor) -> bool:
    """For CUDA rows of heads, and a neox table (float32, a power-of-two head size)."""
    head_dim = table.shape[-1]
    return (
        triton is not None
        and query.is_cuda
        and table.dtype == torch.float32
        and table.is_contiguous()
        and head_dim & (head_dim - 1) == 0
        and query.dim() == 2
        and key.dim() == 2
        and query.stride(1) == 1
        and key.stride(1) == 1
    )


if triton is not None:
    # ANCHOR: rope_kernel
    @triton.jit
    def _rope_heads(rows_ptr, heads, dims, partner, cos, sin, HEAD_DIM: tl.constexpr, mask):
        """Rotate the heads `heads` of one token's row in place."""
        at = rows_ptr + heads[:, None] * HEAD_DIM
        x = tl.load(at + dims[None, :], mask=mask, other=0.0)
        x_partner = tl.load(at + partner[None, :], mask=mask, other=0.0)
        scaled = (x.to(tl.float32) * cos[None, :]).to(x.dtype)  # x * [cos|cos], rounded
        rotated = scaled.to(tl.float32) + x_partner.to(tl.float32) * sin[None, :]
        tl.store(at + dims[None, :], rotated.to(x.dtype), mask=mask)

    @triton.jit
    def _rope_kernel(
        q_ptr,
        k_ptr,
        positions_ptr,
        cos_sin_ptr,
        stride_q,
        stride_k,
        NUM_Q_HEADS: tl.constexpr,
        NUM_K_HEADS: tl.constexpr,
        Q_HEADS_PAD: tl.constexpr,
        K_HEADS_PAD: tl.constexpr,
        HEAD_DIM: tl.constexpr,
    ):
        token = tl.program_id(0)
        position = tl.load(positions_ptr + token)
        dims = tl.arange(0, HEAD_DIM)
        partner = (dims + HEAD_DIM // 2) % HEAD_DIM  # roll(x, D/2)
        # The table rows [cos|cos] and [-sin|sin] (float32), rounded to the activations'
        # dtype as the torch version casts them.
        row = cos_sin_ptr + position * 2 * HEAD_DIM
        dtype = q_ptr.dtype.element_ty
        cos = tl.load(row + dims).to(dtype).to(tl.float32)
        sin = tl.load(row + HEAD_DIM + dims).to(dtype).to(tl.float32)
        q_heads = tl.arange(0, Q_HEADS_PAD)
        _rope_heads(
            q_ptr + token * stride_q, q_heads, dims, partner, cos, sin, HEAD_DIM,
            (q_heads < NUM_Q_HEADS)[:, None],
        )  # fmt: skip
        k_heads = tl.arange(0, K_HEADS_PAD)
        _rope_heads(
            k_ptr + token * stride_k, k_heads, dims, partner, cos, sin, HEAD_DIM,
            (k_heads < NUM_K_HEADS)[:, None],
        )  # fmt: skip

    # ANCHOR_END: rope_kernel


def triton_rope_(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate `query` `[T, Hq*D]` and `key` `[T, Hk*D]` in place by `positions` `[T]`, with a
    neox-style RotaryEmbedding's float32 table `[P, 2, 1, D]`; returns them."""
    head_dim = cos_sin_cache.shape[-1]
    num_tokens = positions.shape[0]
    if num_tokens:
        num_q_heads, num_k_heads = query.shape[1] // head_dim, key.shape[1] // head_dim
        launch(
            _rope_kernel,
            (num_tokens,),
            query,
            key,
            positions,
            cos_sin_cache,
            query.stride(0),
            key.stride(0),
            num_q_heads,
            num_k_heads,
            next_power_of_2(num_q_heads),
            next_power_of_2(num_k_heads),
            head_dim,
            num_warps=4,
        )
    return query, key


def rotary_embedding_cuda(positions, query, key, cos_sin_cache):
    """Neox RoPE of q and k: in place by the kernel where it fits, else the CPU version's
    arithmetic (any device)."""
    if triton_rope_available(query, key, cos_sin_cache):
        return triton_rope_(positions, query, key, cos_sin_cache)
    return cpu.rotary_embedding(positions, query, key, cos_sin_cache)


def apply_deferred_rope(
    rope: tuple[torch.Tensor, torch.Tensor], query: torch.Tensor, key: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k (`[T, ...]`, any head layout) by a fused attention op's `rope`
    (positions, table), out of place: for the attention paths with no kernel rotating them."""
    positions, table = rope
    num_tokens = query.shape[0]
    q_rot, k_rot = cpu.rotary_embedding(
        positions, query.reshape(num_tokens, -1), key.reshape(num_tokens, -1), table
    )
    return q_rot.reshape(query.shape), k_rot.reshape(key.shape)
