"""Paged decode attention's plain form, a program per (request, query head), for the sweeps.

Kept for scripts/gpu/decode_attention_tiles.py to compare with the engine's kernel. The
engine runs the grouped kernel of mini_vllm/kernels/paged_attention.py: a program per
(request, KV head) takes the query heads that share that KV head together, so each cached
key and value is read once for all of them. Here each query head reads its KV head's cache
on its own, four times over at the Llama shapes; it lost to the grouped kernel at every
batch and head shape measured (benchmarks/results/decode-attention-grouped-cuda.md).

Like the grouped kernel it stores the step's new key and value in their slot and starts
its online softmax from them, and it reads the cache through the same helpers
(`cached_kv_tile`, `wait_for_inputs`). It takes no deferred RoPE (the sweeps never pass
one) and runs one slice, with no merge.
"""

from __future__ import annotations

import gpukit  # noqa: F401  (before mini_vllm: it puts the checkout on sys.path)

try:
    import triton
    import triton.language as tl
except ImportError:  # a machine without Triton: the scripts' --help still runs
    triton = None

if triton is not None:
    from mini_vllm.kernels.paged_attention import cached_kv_tile, wait_for_inputs

    @triton.jit
    def per_head_decode_kernel(
        q_ptr, k_ptr, v_ptr, key_cache_ptr, value_cache_ptr, out_ptr, tables_ptr, seq_lens_ptr,
        slot_ptr, scratch_slot, stride_q_tok, stride_q_head, stride_k, stride_v, stride_o_tok,
        stride_o_head, stride_table, scale,
        NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr = False,
    ):  # fmt: skip
        wait_for_inputs(PDL)
        request = tl.program_id(0)
        head = tl.program_id(1)
        kv_head = head // GROUP
        dims = tl.arange(0, HEAD_DIM)
        row = NUM_KV_HEADS * HEAD_DIM
        table_row = tables_ptr + request * stride_table  # this request's block table
        key_rows = key_cache_ptr + kv_head * HEAD_DIM + dims[None, :]
        value_rows = value_cache_ptr + kv_head * HEAD_DIM + dims[None, :]
        # The step's own key and value come from the inputs, not from the cache ...
        new_key = tl.load(k_ptr + request * stride_k + kv_head * HEAD_DIM + dims)
        new_value = tl.load(v_ptr + request * stride_v + kv_head * HEAD_DIM + dims)
        q = tl.load(q_ptr + request * stride_q_tok + head * stride_q_head + dims).to(tl.float32)
        # ... and the first query head of each group stores them for later steps
        # (slot -1, a padded row, goes to the scratch slot).
        if head % GROUP == 0:
            slot = tl.load(slot_ptr + request)
            slot = tl.where(slot < 0, scratch_slot, slot)
            tl.store(key_cache_ptr + slot * row + kv_head * HEAD_DIM + dims, new_key)
            tl.store(value_cache_ptr + slot * row + kv_head * HEAD_DIM + dims, new_value)
        # Online softmax, seeded with the new token; then the tokens already cached.
        running_max = tl.sum(q * new_key.to(tl.float32), axis=0) * scale
        running_sum = tl.zeros_like(running_max) + 1.0
        acc = new_value.to(tl.float32)
        past = tl.maximum(tl.load(seq_lens_ptr + request), 1) - 1
        for start in range(0, past, BLOCK_N):
            keys, values, visible = cached_kv_tile(
                key_rows, value_rows, table_row, start, past, row, BLOCK_SIZE, BLOCK_N
            )
            scores = tl.where(visible, tl.sum(keys * q[None, :], axis=1) * scale, float("-inf"))
            new_max = tl.maximum(running_max, tl.max(scores, axis=0))
            probs = tl.exp(scores - new_max)
            correction = tl.exp(running_max - new_max)
            acc = acc * correction + tl.sum(probs[:, None] * values, axis=0)
            running_sum = running_sum * correction + tl.sum(probs, axis=0)
            running_max = new_max
        tl.store(
            out_ptr + request * stride_o_tok + head * stride_o_head + dims,
            (acc / running_sum).to(out_ptr.dtype.element_ty),
        )


def per_head_paged_decode(
    q, k, v, kv_cache, block_tables, seq_lens, slot_mapping, scale, tile, output=None
):
    """Store each request's new k/v in its slot and attend over its blocks, a program per
    (request, query head): the arguments of `triton_paged_decode`
    (mini_vllm/kernels/paged_attention.py), with `tile` = (cached tokens an iteration,
    warps a program) instead of a plan. Returns `output`, or a new tensor like q."""
    import torch

    from mini_vllm.kernels.gemv import pdl_supported
    from mini_vllm.kernels.launch import launch

    num_reqs, num_heads, head_dim = q.shape
    num_kv_heads, block_size = kv_cache.shape[3], kv_cache.shape[2]
    out = output if output is not None else torch.empty(q.shape, dtype=q.dtype, device=q.device)
    scratch = kv_cache.shape[1] * block_size - 1
    scale = scale if scale is not None else head_dim**-0.5
    pdl = pdl_supported(q.device)
    # Launch arguments in rows, as the kernel's signature lists them, constexprs last.
    # fmt: off
    launch(
        per_head_decode_kernel, (num_reqs, num_heads),
        q, k, v, kv_cache[0], kv_cache[1], out, block_tables, seq_lens, slot_mapping, scratch,
        q.stride(0), q.stride(1), k.stride(0), v.stride(0), out.stride(0), out.stride(1),
        block_tables.stride(0), scale,
        # NUM_KV_HEADS, GROUP, HEAD_DIM, BLOCK_SIZE, BLOCK_N, PDL
        num_kv_heads, num_heads // num_kv_heads, head_dim, block_size, tile[0], pdl,
        num_warps=tile[1], **({"launch_pdl": True} if pdl else {}),
    )
    # fmt: on
    return out
