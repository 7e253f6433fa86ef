"""Paged decode attention and the KV-cache write as two Triton kernels (CUDA only).

vLLM counterpart: the decode path of its attention backends — `reshape_and_cache_flash`
(csrc/cache_kernels.cu) writes the new keys and values into their slots, and a paged
decode kernel (FlashAttention's, or vllm/attention/ops/triton_unified_attention.py in
Triton) reads each request's blocks through the block table. nano-vllm:
`store_kvcache_kernel` in nanovllm/layers/attention.py (a Triton store, then
flash-attn with a block table).

Why: in plain torch a decode step's attention is about a dozen kernels a layer (the
scatter of the new k/v, two gathers of the cache, the mask, attention, copies). Under a
CUDA graph every kernel is a node that costs ~1-2 µs even when it does almost nothing,
so at 30 layers the plumbing costs more than the work. Here it is two kernels a layer.

Layout (as mini_vllm/attention/paged.py): the cache of a layer is
`[2, num_blocks + 1, block_size, num_kv_heads, head_dim]`; slot -1 writes to the last
slot of the scratch block. One program per (request, KV head) walks the request's
blocks with an online softmax and produces the outputs of the GROUP query heads that
share that KV head. Sequence length 0 (a padded row) is treated as 1, as in the torch
path, so the row stays finite.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU machines: the torch path is used
    triton = None

__all__ = ["triton_available", "triton_paged_decode", "triton_write_kv"]


def triton_available() -> bool:
    return triton is not None and torch.cuda.is_available()


if triton is not None:

    # ANCHOR: write_kv_kernel
    @triton.jit
    def _write_kv_kernel(k_ptr, v_ptr, key_cache_ptr, value_cache_ptr, slot_ptr, scratch_slot,
                         stride_k, stride_v, ROW: tl.constexpr, ROW_PAD: tl.constexpr):
        token = tl.program_id(0)
        slot = tl.load(slot_ptr + token)
        slot = tl.where(slot < 0, scratch_slot, slot)
        offsets = tl.arange(0, ROW_PAD)
        mask = offsets < ROW
        key = tl.load(k_ptr + token * stride_k + offsets, mask=mask)
        value = tl.load(v_ptr + token * stride_v + offsets, mask=mask)
        tl.store(key_cache_ptr + slot * ROW + offsets, key, mask=mask)
        tl.store(value_cache_ptr + slot * ROW + offsets, value, mask=mask)
    # ANCHOR_END: write_kv_kernel

    # ANCHOR: paged_decode_kernel
    @triton.jit
    def _paged_decode_kernel(q_ptr, key_cache_ptr, value_cache_ptr, out_ptr, tables_ptr, seq_lens_ptr,
                             stride_q_tok, stride_q_head, stride_o_tok, stride_o_head, stride_table, scale,
                             NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                             HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr):
        request = tl.program_id(0)
        kv_head = tl.program_id(1)
        seq_len = tl.maximum(tl.load(seq_lens_ptr + request), 1)
        heads = kv_head * GROUP + tl.arange(0, GROUP_PAD)
        head_mask = tl.arange(0, GROUP_PAD) < GROUP
        dims = tl.arange(0, HEAD_DIM)
        q = tl.load(q_ptr + request * stride_q_tok + heads[:, None] * stride_q_head + dims[None, :],
                    mask=head_mask[:, None], other=0.0).to(tl.float32)
        running_max = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        running_sum = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
        row = NUM_KV_HEADS * HEAD_DIM
        for b in range(0, tl.cdiv(seq_len, BLOCK_SIZE)):
            block = tl.load(tables_ptr + request * stride_table + b)
            tokens = tl.arange(0, BLOCK_SIZE)
            visible = b * BLOCK_SIZE + tokens < seq_len
            offsets = (block * BLOCK_SIZE + tokens)[:, None] * row + kv_head * HEAD_DIM + dims[None, :]
            keys = tl.load(key_cache_ptr + offsets, mask=visible[:, None], other=0.0).to(tl.float32)
            scores = tl.sum(q[:, None, :] * keys[None, :, :], axis=2) * scale  # [GROUP_PAD, BLOCK_SIZE]
            scores = tl.where(visible[None, :], scores, float("-inf"))
            new_max = tl.maximum(running_max, tl.max(scores, axis=1))
            probs = tl.exp(scores - new_max[:, None])
            correction = tl.exp(running_max - new_max)
            values = tl.load(value_cache_ptr + offsets, mask=visible[:, None], other=0.0).to(tl.float32)
            acc = acc * correction[:, None] + tl.sum(probs[:, :, None] * values[None, :, :], axis=1)
            running_sum = running_sum * correction + tl.sum(probs, axis=1)
            running_max = new_max
        out = acc / running_sum[:, None]
        tl.store(out_ptr + request * stride_o_tok + heads[:, None] * stride_o_head + dims[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=head_mask[:, None])
    # ANCHOR_END: paged_decode_kernel


def triton_write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    num_tokens, num_kv_heads, head_dim = k.shape
    row = num_kv_heads * head_dim
    scratch = kv_cache.shape[1] * kv_cache.shape[2] - 1
    _write_kv_kernel[(num_tokens,)](
        k, v, kv_cache[0], kv_cache[1], slot_mapping, scratch, k.stride(0), v.stride(0),
        ROW=row, ROW_PAD=triton.next_power_of_2(row),
    )


def triton_paged_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                        seq_lens: torch.Tensor, scale: float | None, output: torch.Tensor | None = None) -> torch.Tensor:
    num_reqs, num_heads, head_dim = q.shape
    num_kv_heads, block_size = kv_cache.shape[3], kv_cache.shape[2]
    group = num_heads // num_kv_heads
    out = output if output is not None else torch.empty(q.shape, dtype=q.dtype, device=q.device)
    _paged_decode_kernel[(num_reqs, num_kv_heads)](
        q, kv_cache[0], kv_cache[1], out, block_tables, seq_lens,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        scale if scale is not None else head_dim ** -0.5,
        NUM_KV_HEADS=num_kv_heads, GROUP=group, GROUP_PAD=max(triton.next_power_of_2(group), 1),
        HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
    )
    return out
