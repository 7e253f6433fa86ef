"""Paged attention and the KV-cache write as Triton kernels (CUDA only).

vLLM counterpart: its attention backends — `reshape_and_cache_flash`
(csrc/cache_kernels.cu) writes the new keys and values into their slots, and a paged
kernel (FlashAttention's varlen one, or in Triton `kernel_unified_attention` of
vllm/v1/attention/ops/triton_unified_attention.py) reads each request's blocks through
the block table. nano-vllm:
`store_kvcache_kernel` in nanovllm/layers/attention.py (a Triton store, then
flash-attn with a block table).

Why: in plain torch a decode step's attention is about a dozen kernels a layer (the
scatter of the new k/v, two gathers of the cache, the mask, attention, copies). Under a
CUDA graph every kernel is still a node with a fixed cost of its own even when it does
almost nothing, so at 30 layers the plumbing costs more than the work. Here it is one or
two kernels a layer.

Layout (as mini_vllm/attention/paged.py): the cache of a layer is
`[2, num_blocks + 1, block_size, num_kv_heads, head_dim]`; slot -1 writes to the last
slot of the scratch block. A program walks a request's blocks with an online softmax.
The decode kernel also stores the step's new key and value (the first slice of each KV
head does it), so a decode step's attention is one kernel a layer (two with slices).
Sequence length 0 (a padded row) is treated as 1, as in the torch path, so the row stays
finite.

A mixed step (prefill chunks of any length beside decodes) is the write kernel and one
more: the unified kernel, vLLM's Triton design. A program takes a run of one request's
new tokens (all of a decode's one) and the query heads of one KV head, walks that
request's blocks up to its last token's position with an online softmax, and masks
each row causally at its own position. Which request a program serves is found on the
device (a binary search over `query_start_loc`), so the launch needs no per-request
table from the host.

The decode kernel takes the query heads of a group together: a program per (request, KV
head) reads each key and value of its KV head once for all the query heads that share it,
and multiplies them on the tensor cores (`tl.dot`, the group padded to 16 rows), as vLLM's
`_fwd_grouped_kernel_stage1` does for grouped-query attention
(vllm/v1/attention/ops/triton_decode_attention.py). A program per (request, query head)
would read the cache once a query head, four times over at the Llama shapes: it lost to
this at every batch and head shape measured (scripts/gpu/decode_attention_tiles.py, which
keeps that per-head form to compare; benchmarks/results/decode-attention-grouped-cuda.md).

Small batches: a program per (request, KV head) leaves most of an H100 idle (3 programs at
batch 1 for SmolLM2) while each walks the whole context alone. So below about a GPU's
worth of programs the cached tokens are cut into slices that run in parallel, and a
second kernel merges the slices' partial softmaxes: flash-decoding (Dao et al., 2023),
vLLM's stage 1 and stage 2. Where no request can hold more than one 128-token tile, one
slice is still the faster choice (`decode_num_splits`).

`TritonPagedAttentionBackend` runs them: the paged backend of mini_vllm/attention/paged.py
with its decode and its KV write on these kernels (the model runner picks it through the
kernel table, mini_vllm/_custom_ops.py).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from mini_vllm.attention.paged import PagedAttentionBackend, PagedAttentionMetadata
from mini_vllm.kernels.gemv import pdl_supported
from mini_vllm.kernels.launch import launch, next_power_of_2
from mini_vllm.kernels.rotary_embedding import apply_deferred_rope

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU machines: the torch path is used
    triton = None

__all__ = [
    "DecodePlan",
    "TritonPagedAttentionBackend",
    "cached_kv_tile",
    "decode_num_splits",
    "decode_plan",
    "triton_available",
    "triton_paged_decode",
    "triton_unified_attention",
    "triton_write_kv",
    "wait_for_inputs",
]


def triton_available() -> bool:
    return triton is not None and torch.cuda.is_available()


if triton is not None:
    # ANCHOR: write_kv_kernel
    @triton.jit
    def _write_kv_kernel(
        k_ptr,
        v_ptr,
        key_cache_ptr,
        value_cache_ptr,
        slot_ptr,
        scratch_slot,
        stride_k,
        stride_v,
        ROW: tl.constexpr,
        ROW_PAD: tl.constexpr,
    ):
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

    @triton.jit
    def wait_for_inputs(PDL: tl.constexpr):
        # Under programmatic dependent launch (mini_vllm/kernels/gemv.py): let the
        # next kernel be scheduled now (it waits for this one before reading anything),
        # and wait for the kernel before this one before reading its outputs.
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()

    # ANCHOR: rope_in_kernel
    @triton.jit
    def _rope_rows(
        positions_ptr, cos_sin_ptr, request, dims, HEAD_DIM: tl.constexpr, dtype: tl.constexpr
    ):
        """Rows [cos | cos] and [-sin | sin] of the request's position (RotaryEmbedding's
        neox table, float32, rounded to the activations' dtype as the torch version
        rounds it), and each channel's partner (i + D/2 mod D)."""
        position = tl.load(positions_ptr + request)
        cos = tl.load(cos_sin_ptr + position * 2 * HEAD_DIM + dims).to(dtype).to(tl.float32)
        sin = (
            tl.load(cos_sin_ptr + position * 2 * HEAD_DIM + HEAD_DIM + dims)
            .to(dtype)
            .to(tl.float32)
        )
        return cos, sin, (dims + HEAD_DIM // 2) % HEAD_DIM

    @triton.jit
    def _rotate(x, x_partner, cos, sin, dtype: tl.constexpr):
        """x * [cos|cos] + roll(x, D/2) * [-sin|sin], rounded once to `dtype` (as Inductor's
        version of RotaryEmbedding._rotate), returned in float32."""
        return (x.to(tl.float32) * cos + x_partner.to(tl.float32) * sin).to(dtype).to(tl.float32)

    # ANCHOR_END: rope_in_kernel

    @triton.jit
    def cached_kv_tile(
        key_rows,
        value_rows,
        table_row,
        start,
        end,
        row,
        BLOCK_SIZE: tl.constexpr,
        BLOCK_N: tl.constexpr,
        FLOAT32: tl.constexpr = True,
    ):
        """Keys and values `[BLOCK_N, HEAD_DIM]` of the cached tokens from `start` (float32,
        or with FLOAT32 False the cache's dtype), found through a request's block table
        (`table_row`); tokens from `end` on are masked (`visible` False) and read as 0.
        `key_rows` / `value_rows` point at the KV head's columns of slot 0; a slot is `row`
        elements long."""
        tokens = start + tl.arange(0, BLOCK_N)
        visible = tokens < end
        blocks = tl.load(table_row + tokens // BLOCK_SIZE, mask=visible, other=0)
        slots = (blocks * BLOCK_SIZE + tokens % BLOCK_SIZE)[:, None] * row
        # Keys and values are both requested before either is used: one trip to memory
        # per tile, not two (the cache is cold: the weights evicted it).
        keys = tl.load(key_rows + slots, mask=visible[:, None], other=0.0)
        values = tl.load(value_rows + slots, mask=visible[:, None], other=0.0)
        if FLOAT32:
            keys = keys.to(tl.float32)
            values = values.to(tl.float32)
        return keys, values, visible

    @triton.jit
    def _online_softmax_step(scores, values, acc, running_sum, running_max, DOT_PRECISION):
        """Fold one tile of scores `[rows, tokens]` and its values into each row's running
        maximum, sum of exponentials and weighted sum (the online softmax)."""
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        probs = tl.exp(scores - new_max[:, None])
        correction = tl.exp(running_max - new_max)
        weighted = tl.dot(probs.to(values.dtype), values, input_precision=DOT_PRECISION)
        acc = acc * correction[:, None] + weighted
        running_sum = running_sum * correction + tl.sum(probs, axis=1)
        return acc, running_sum, new_max

    # ANCHOR: split_decode_kernels
    @triton.jit
    def _paged_decode_grouped_kernel(
        q_ptr, k_ptr, v_ptr, key_cache_ptr, value_cache_ptr, tables_ptr, seq_lens_ptr, slot_ptr,
        scratch_slot, part_acc_ptr, part_max_ptr, part_sum_ptr, out_ptr, stride_q_tok,
        stride_q_head, stride_k, stride_v, stride_o_tok, stride_o_head, stride_table, scale,
        positions_ptr, cos_sin_ptr,
        NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
        HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
        NUM_SPLITS: tl.constexpr, ROPE: tl.constexpr = False, PDL: tl.constexpr = False,
        DOT_PRECISION: tl.constexpr = "tf32",
    ):  # fmt: skip
        wait_for_inputs(PDL)
        # One program per (request, KV head, slice of the cached tokens), for all the
        # query heads that read this KV head at once: each key is loaded once for the group.
        request = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        group = tl.arange(0, GROUP_PAD)
        heads = kv_head * GROUP + group
        real_head = group < GROUP
        dims = tl.arange(0, HEAD_DIM)
        row = NUM_KV_HEADS * HEAD_DIM
        table_row = tables_ptr + request * stride_table  # this request's block table
        key_rows = key_cache_ptr + kv_head * HEAD_DIM + dims[None, :]
        value_rows = value_cache_ptr + kv_head * HEAD_DIM + dims[None, :]
        q = tl.load(
            q_ptr + request * stride_q_tok + heads[:, None] * stride_q_head + dims[None, :],
            mask=real_head[:, None],
            other=0.0,
        ).to(tl.float32)
        # Slice 0 starts from the step's own key and value and stores them in their slot;
        # the other slices start empty (max -inf, sum 0), which the merge weighs as 0.
        first = split == 0
        new_key = tl.load(k_ptr + request * stride_k + kv_head * HEAD_DIM + dims).to(tl.float32)
        new_value = tl.load(v_ptr + request * stride_v + kv_head * HEAD_DIM + dims)
        if ROPE:  # rotate q and the new key here (the compile-time fusion of RoPE into attention)
            cos, sin, partner = _rope_rows(
                positions_ptr, cos_sin_ptr, request, dims, HEAD_DIM, q_ptr.dtype.element_ty
            )
            q_partner = tl.load(
                q_ptr + request * stride_q_tok + heads[:, None] * stride_q_head + partner[None, :],
                mask=real_head[:, None],
                other=0.0,
            )
            k_partner = tl.load(k_ptr + request * stride_k + kv_head * HEAD_DIM + partner)
            q = _rotate(q, q_partner, cos[None, :], sin[None, :], q_ptr.dtype.element_ty)
            new_key = _rotate(new_key, k_partner, cos, sin, q_ptr.dtype.element_ty)
        slot = tl.load(slot_ptr + request)
        slot = tl.where(slot < 0, scratch_slot, slot)
        store_mask = (dims < HEAD_DIM) & first
        tl.store(
            key_cache_ptr + slot * row + kv_head * HEAD_DIM + dims,
            new_key.to(key_cache_ptr.dtype.element_ty),
            mask=store_mask,
        )
        tl.store(
            value_cache_ptr + slot * row + kv_head * HEAD_DIM + dims, new_value, mask=store_mask
        )
        seeded = tl.where(first, 1.0, 0.0)
        running_max = tl.where(first, tl.sum(q * new_key[None, :], axis=1) * scale, float("-inf"))
        running_sum = tl.zeros([GROUP_PAD], tl.float32) + seeded
        acc = (
            tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32) + new_value.to(tl.float32)[None, :] * seeded
        )
        past = tl.maximum(tl.load(seq_lens_ptr + request), 1) - 1
        chunk = (past + NUM_SPLITS - 1) // NUM_SPLITS
        start = split * chunk
        end = tl.minimum(past, start + chunk)
        q_dot = q.to(key_cache_ptr.dtype.element_ty)
        for block_start in range(start, end, BLOCK_N):
            keys, values, visible = cached_kv_tile(
                key_rows, value_rows, table_row, block_start, end, row, BLOCK_SIZE, BLOCK_N, False
            )
            scores = tl.dot(q_dot, tl.trans(keys), input_precision=DOT_PRECISION) * scale
            scores = tl.where(visible[None, :], scores, float("-inf"))  # [group, tokens]
            acc, running_sum, running_max = _online_softmax_step(
                scores, values, acc, running_sum, running_max, DOT_PRECISION
            )
        if NUM_SPLITS == 1:  # one slice holds the whole context: the result itself
            tl.store(
                out_ptr + request * stride_o_tok + heads[:, None] * stride_o_head + dims[None, :],
                (acc / running_sum[:, None]).to(out_ptr.dtype.element_ty),
                mask=real_head[:, None],
            )
        else:  # partial results, not yet divided by their sums: [request, head, split(, dim)]
            part = (request * NUM_KV_HEADS * GROUP + heads) * NUM_SPLITS + split
            tl.store(part_max_ptr + part, running_max, mask=real_head)
            tl.store(part_sum_ptr + part, running_sum, mask=real_head)
            tl.store(
                part_acc_ptr + part[:, None] * HEAD_DIM + dims[None, :],
                acc,
                mask=real_head[:, None],
            )

    @triton.jit
    def _merge_splits_kernel(
        part_acc_ptr,
        part_max_ptr,
        part_sum_ptr,
        out_ptr,
        stride_o_tok,
        stride_o_head,
        NUM_HEADS: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        NUM_SPLITS: tl.constexpr,
        PDL: tl.constexpr = False,
    ):
        wait_for_inputs(PDL)
        # Each slice's softmax was taken against its own maximum: rescale all of them
        # to the overall maximum, then add (the merge of flash-decoding).
        request = tl.program_id(0)
        head = tl.program_id(1)
        splits = tl.arange(0, NUM_SPLITS)
        dims = tl.arange(0, HEAD_DIM)
        part = (request * NUM_HEADS + head) * NUM_SPLITS + splits
        maxima = tl.load(part_max_ptr + part)
        weights = tl.exp(maxima - tl.max(maxima, axis=0))  # an empty slice (-inf) weighs 0
        total = tl.sum(weights * tl.load(part_sum_ptr + part), axis=0)
        acc = tl.sum(
            weights[:, None] * tl.load(part_acc_ptr + part[:, None] * HEAD_DIM + dims[None, :]),
            axis=0,
        )
        tl.store(
            out_ptr + request * stride_o_tok + head * stride_o_head + dims,
            (acc / total).to(out_ptr.dtype.element_ty),
        )

    # ANCHOR_END: split_decode_kernels

    # ANCHOR: unified_kernel
    @triton.jit
    def _request_of_block(query_start_loc_ptr, q_block, num_reqs, BLOCK_Q: tl.constexpr):
        """The request whose queries q_block covers. Request r's blocks are numbered from
        start_r // BLOCK_Q + r (one spare block a request, so no block holds two); a
        binary search over those first numbers finds the last request starting at or
        before q_block."""
        low = 0
        high = num_reqs
        while low < high:
            middle = (low + high) // 2
            first_block = tl.load(query_start_loc_ptr + middle) // BLOCK_Q + middle
            if first_block <= q_block:
                low = middle + 1
            else:
                high = middle
        return low - 1

    @triton.jit
    def _unified_attention_kernel(
        q_ptr, key_cache_ptr, value_cache_ptr, tables_ptr, seq_lens_ptr, query_start_loc_ptr,
        out_ptr, num_reqs, stride_q_tok, stride_q_head, stride_o_tok, stride_o_head,
        stride_table, scale,
        NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr = "tf32",
    ):  # fmt: skip
        # One program per (BLOCK_Q queries of one request, KV head): its BLOCK_Q tokens
        # times the GROUP query heads that share the KV head are the BLOCK_M rows of one
        # tile, so each key and value is read once for all of them.
        q_block = tl.program_id(0)
        kv_head = tl.program_id(1)
        request = _request_of_block(query_start_loc_ptr, q_block, num_reqs, BLOCK_Q)
        q_start = tl.load(query_start_loc_ptr + request)
        q_len = tl.load(query_start_loc_ptr + request + 1) - q_start
        local_block = q_block - (q_start // BLOCK_Q + request)
        if local_block * BLOCK_Q >= q_len:
            return  # a spare block: past the end of its request's queries
        seq_len = tl.load(seq_lens_ptr + request)
        cached_before = seq_len - q_len
        rows = tl.arange(0, BLOCK_M)
        token = local_block * BLOCK_Q + rows // GROUP  # within the request
        heads = kv_head * GROUP + rows % GROUP
        real = (token < q_len) & (rows < BLOCK_Q * GROUP)
        dims = tl.arange(0, HEAD_DIM)
        q = tl.load(
            q_ptr
            + (q_start + token)[:, None] * stride_q_tok
            + heads[:, None] * stride_q_head
            + dims[None, :],
            mask=real[:, None],
            other=0.0,
        )
        position = cached_before + token  # each row's token in its sequence
        # Causal: the block's last token sees keys up to its own position, no further.
        end = tl.minimum(seq_len, cached_before + (local_block + 1) * BLOCK_Q)
        row = NUM_KV_HEADS * HEAD_DIM
        table_row = tables_ptr + request * stride_table
        key_rows = key_cache_ptr + kv_head * HEAD_DIM + dims[None, :]
        value_rows = value_cache_ptr + kv_head * HEAD_DIM + dims[None, :]
        running_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
        running_sum = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        for block_start in range(0, end, BLOCK_N):
            keys, values, visible = cached_kv_tile(
                key_rows, value_rows, table_row, block_start, end, row, BLOCK_SIZE, BLOCK_N, False
            )
            scores = tl.dot(q, tl.trans(keys), input_precision=DOT_PRECISION) * scale
            key_position = block_start + tl.arange(0, BLOCK_N)
            # Key 0 is visible to every row (real or not), so no row's maximum stays -inf.
            allowed = visible[None, :] & (key_position[None, :] <= position[:, None])
            scores = tl.where(allowed, scores, float("-inf"))
            acc, running_sum, running_max = _online_softmax_step(
                scores, values, acc, running_sum, running_max, DOT_PRECISION
            )
        tl.store(
            out_ptr
            + (q_start + token)[:, None] * stride_o_tok
            + heads[:, None] * stride_o_head
            + dims[None, :],
            (acc / running_sum[:, None]).to(out_ptr.dtype.element_ty),
            mask=real[:, None],
        )

    # ANCHOR_END: unified_kernel


# The tiles, (cached tokens an iteration, warps a program), and the programs a step aims
# at, from the sweeps of scripts/gpu/decode_attention_tiles.py and
# scripts/gpu/split_decode.py (H100, bf16, in a CUDA graph, the cache read from memory;
# benchmarks/results/decode-attention-grouped-cuda.md and
# decode-graphs-cuda-split-decode.md). (32, 4) was the grouped kernel's best tile or close
# to it at SmolLM2's, Llama-3.2-1B's and Llama-3.1-8B's heads. Its best count of slices
# made about 1024 programs at head dim 64 and 512 at 128, where each program does twice
# the work: so the slices aim at TARGET_PROGRAMS * 64 / head_dim, rounded down to a power
# of two. At the cap of 16 slices (a small batch) each slice is short, and one warp with
# 16 tokens ran the engine's step faster than (32, 4).
GROUPED_TILE = (32, 4)
MANY_SLICES_TILE = (16, 1)  # for MAX_SPLITS slices
TARGET_PROGRAMS = 1024  # at head dim 64
MAX_SPLITS = 16
# Up to 128 tokens, one slice: the slices and their merge barely pay there, and lose as
# soon as the batch grows; from about 192 on they win.
SINGLE_PASS_MAX_CONTEXT = 128


class DecodePlan(NamedTuple):
    """How one call of `triton_paged_decode` runs: the tile (cached tokens an iteration,
    warps a program), and the slices each request's cached tokens are cut into (more than
    one adds the merge kernel)."""

    tile: tuple[int, int]
    splits: int


def decode_num_splits(
    num_reqs: int, num_kv_heads: int, head_dim: int, max_context: int | None = None
) -> int:
    """Slices of the cached tokens per (request, KV head): enough for about
    TARGET_PROGRAMS * 64 / head_dim programs, as a power of two (for tl.arange) from 1 to
    MAX_SPLITS; 1 when no request can hold more than SINGLE_PASS_MAX_CONTEXT tokens
    (`max_context`)."""
    if max_context is not None and max_context <= SINGLE_PASS_MAX_CONTEXT:
        return 1
    wanted = TARGET_PROGRAMS * 64 // (head_dim * num_reqs * num_kv_heads)
    return min(MAX_SPLITS, 1 << (wanted.bit_length() - 1)) if wanted > 1 else 1


def decode_plan(
    num_reqs: int, num_kv_heads: int, head_dim: int, max_context: int | None = None
) -> DecodePlan:
    """The engine's plan for a decode batch: the slices of `decode_num_splits`, and the tile
    for that many."""
    splits = decode_num_splits(num_reqs, num_kv_heads, head_dim, max_context)
    return DecodePlan(MANY_SLICES_TILE if splits == MAX_SPLITS else GROUPED_TILE, splits)


def triton_write_kv(
    kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    num_tokens, num_kv_heads, head_dim = k.shape
    row = num_kv_heads * head_dim
    scratch = kv_cache.shape[1] * kv_cache.shape[2] - 1
    launch(
        _write_kv_kernel,
        (num_tokens,),
        k,
        v,
        kv_cache[0],
        kv_cache[1],
        slot_mapping,
        scratch,
        k.stride(0),
        v.stride(0),
        row,  # ROW
        next_power_of_2(row),  # ROW_PAD
    )


def triton_paged_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    slot_mapping: torch.Tensor,
    scale: float | None,
    output: torch.Tensor | None = None,
    rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    plan: DecodePlan | None = None,
) -> torch.Tensor:
    """Store each request's new k/v in its slot and attend over its blocks.

    `plan` (default: `decode_plan`'s) picks the tile and the slices: a small
    batch splits each request's cached tokens into slices that run in parallel, then
    merges them (two kernels, flash-decoding); a batch that fills the GPU on its own runs
    one slice (one kernel).
    `rope` = (positions, RotaryEmbedding.cos_sin_cache of a neox-style rotary): q and k
    arrive unrotated and the kernel rotates them (compile-time fusion).
    """
    num_reqs, num_heads, head_dim = q.shape
    num_kv_heads, block_size = kv_cache.shape[3], kv_cache.shape[2]
    out = output if output is not None else torch.empty(q.shape, dtype=q.dtype, device=q.device)
    scratch = kv_cache.shape[1] * block_size - 1
    scale = scale if scale is not None else head_dim**-0.5
    group = num_heads // num_kv_heads
    # The table's width bounds every request's context in this call: under a FULL graph
    # it is the longest a request may ever be (so the captured choice holds for every
    # replay), eagerly the longest request of this batch.
    max_context = block_tables.shape[1] * block_size
    if plan is None:
        plan = decode_plan(num_reqs, num_kv_heads, head_dim, max_context)
    tile, splits = plan
    if splits < 1 or splits & (splits - 1):
        raise ValueError(f"a decode plan's slices must be a power of two; got {plan}")
    positions, cos_sin = rope if rope is not None else (slot_mapping, q)  # unused without rope
    pdl = pdl_supported(q.device)
    options = {"launch_pdl": True} if pdl else {}
    if rope is not None and (
        cos_sin.dtype != torch.float32
        or not cos_sin.is_contiguous()
        or cos_sin.shape[-1] != head_dim
        or cos_sin.shape[1] != 2
    ):
        raise ValueError("rope needs the float32 neox table [positions, 2, 1, head_dim]")
    if splits > 1:
        part_acc = torch.empty(
            (num_reqs, num_heads, splits, head_dim), dtype=torch.float32, device=q.device
        )
        part_max = torch.empty((num_reqs, num_heads, splits), dtype=torch.float32, device=q.device)
        part_sum = torch.empty_like(part_max)
    else:  # one slice writes the output itself: no partial results
        part_acc = part_max = part_sum = out
    # Launch arguments in rows, as the kernels' signatures list them, constexprs last (the
    # formatter would give each of the thirty its own line).
    # fmt: off
    launch(
        _paged_decode_grouped_kernel, (num_reqs, num_kv_heads, splits),
        q, k, v, kv_cache[0], kv_cache[1], block_tables, seq_lens, slot_mapping, scratch,
        part_acc, part_max, part_sum, out, q.stride(0), q.stride(1), k.stride(0), v.stride(0),
        out.stride(0), out.stride(1), block_tables.stride(0), scale, positions, cos_sin,
        num_kv_heads, group, max(16, next_power_of_2(group)), head_dim, block_size,
        tile[0], splits, rope is not None, pdl,  # ... BLOCK_N, NUM_SPLITS, ROPE, PDL
        "ieee" if q.dtype == torch.float32 else "tf32",  # DOT_PRECISION
        num_warps=tile[1], **options,
    )
    if splits > 1:
        launch(
            _merge_splits_kernel, (num_reqs, num_heads),
            part_acc, part_max, part_sum, out, out.stride(0), out.stride(1),
            num_heads, head_dim, splits, pdl, num_warps=1, **options,
        )
    # fmt: on
    return out


# Rows of a mixed-step tile (query tokens times the query heads of a KV head) and the
# keys an iteration reads: vLLM's unified kernel takes 16 rows when a step is all short
# queries and more for prefill; 64 rows and 64 keys keep one kernel for both.
UNIFIED_BLOCK_M = 64
UNIFIED_BLOCK_N = 64


# ANCHOR: triton_unified_attention
def triton_unified_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_tokens: int,
    scale: float | None,
    output: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention for every request of a mixed step in one kernel, whatever each one's
    number of new tokens (the cache already holds them). Rows past `num_tokens` (the
    padding of a piecewise graph's size) are zeroed."""
    num_rows, num_heads, head_dim = q.shape
    num_reqs = seq_lens.shape[0]
    num_kv_heads, block_size = kv_cache.shape[3], kv_cache.shape[2]
    group = num_heads // num_kv_heads
    out = output if output is not None else torch.empty_like(q)
    if num_tokens < num_rows:
        out[num_tokens:].zero_()
    block_q = max(1, UNIFIED_BLOCK_M // group)
    block_m = max(16, next_power_of_2(block_q * group))
    # Each request may leave one block partly empty, and the numbering gives each a
    # spare one: enough programs for the worst case, the spare ones return at once.
    num_q_blocks = num_tokens // block_q + num_reqs
    scale = scale if scale is not None else head_dim**-0.5
    # fmt: off
    launch(
        _unified_attention_kernel, (num_q_blocks, num_kv_heads),
        q, kv_cache[0], kv_cache[1], block_tables, seq_lens, query_start_loc, out, num_reqs,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0), scale,
        num_kv_heads, group, head_dim, block_size, block_q, block_m, UNIFIED_BLOCK_N,
        "ieee" if q.dtype == torch.float32 else "tf32",  # DOT_PRECISION
        num_warps=4,
    )
    # fmt: on
    return out


# ANCHOR_END: triton_unified_attention


# ANCHOR: triton_backend
class TritonPagedAttentionBackend(PagedAttentionBackend):
    """The paged backend with its decode, its mixed steps and its cache writes on the
    kernels above.

    A uniform decode batch on CUDA is one kernel a layer (two with slices): it stores the
    new keys and values, attends, and rotates q and k first when the fusion pass deferred
    RoPE to it (`rope`). Any other batch is two: the write kernel, then the unified kernel
    for every request at once."""

    name = "paged-triton"
    accepts_output = True  # the decode kernel writes straight into the layer's buffer
    accepts_rope = True

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: PagedAttentionMetadata,
        output: torch.Tensor | None = None,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        if metadata.uniform_decode and q.is_cuda and kv_cache is not None:
            num_reqs = q.shape[0]
            return triton_paged_decode(
                q,
                k,
                v,
                kv_cache,
                metadata.block_tables[:num_reqs],
                metadata.seq_lens[:num_reqs],
                metadata.slot_mapping[:num_reqs],
                self.scale,
                output,
                rope=rope,
            )
        if rope is not None:  # only the decode kernel rotates: rotate first
            q, k = apply_deferred_rope(rope, q, k)
        if not (q.is_cuda and kv_cache is not None):
            return super().forward(q, k, v, kv_cache, metadata)
        self.write_kv(kv_cache, k, v, metadata.slot_mapping[: k.shape[0]])
        num_reqs = metadata.num_reqs
        return triton_unified_attention(
            q,
            kv_cache,
            metadata.block_tables[:num_reqs],
            metadata.seq_lens[:num_reqs],
            metadata.query_start_loc[: num_reqs + 1],
            metadata.num_actual_tokens,
            self.scale,
            output,
        )

    def write_kv(self, kv_cache, k, v, slot_mapping) -> None:
        if k.is_cuda:
            triton_write_kv(kv_cache, k, v, slot_mapping)
        else:
            super().write_kv(kv_cache, k, v, slot_mapping)


# ANCHOR_END: triton_backend
