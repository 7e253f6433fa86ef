"""Phase 02's attention backend: a paged KV cache read through block tables, in plain torch.

vLLM counterpart: the attention backends of vllm/v1/attention/backends/ (for example
flash_attn.py: `FlashAttentionImpl.forward` writes the new keys and values with
`reshape_and_cache_flash`, then runs a variable-length kernel that reads the cache
through the block table) and their metadata builders. nano-vllm:
nanovllm/layers/attention.py (`store_kvcache`, then flash-attn with a block table).

Cache layout per layer: `[2, num_blocks, block_size, num_kv_heads, head_dim]`. A
token's *slot* is `block_id * block_size + offset`; `slot_mapping[i]` says where token
i's key and value go, and -1 means "do not write" (padded rows of a CUDA graph). The
last block of every cache tensor is a scratch block the block manager never hands
out: -1 slots are redirected there, so the write has no data-dependent shape and can
be captured in a graph.

Two paths, chosen on the host:
- uniform decode (every request has one new token): one batched gather through the
  block tables and one attention call — static shapes, capturable in a FULL graph;
- anything with a prefill: one attention call per request, with a causal mask offset
  by the tokens already in the cache. Python loops over requests, so this path only
  ever runs eagerly (or between piecewise graphs).
Hence `cudagraph_support = UNIFORM_SINGLE_TOKEN_DECODE`.

On CUDA, where the kernel table has them (mini_vllm/_custom_ops.py), the model runner
uses `TritonPagedAttentionBackend` (mini_vllm/kernels/paged_attention.py), which extends
this one: its decode and its cache writes are Triton kernels, the rest is this code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mini_vllm.attention.backend import AttentionBackend
from mini_vllm.config.compilation import AttentionCGSupport

__all__ = [
    "PagedAttentionBackend",
    "PagedAttentionMetadata",
    "allocate_paged_kv_caches",
    "SCRATCH_BLOCKS",
]

SCRATCH_BLOCKS = 1  # extra block per cache tensor that absorbs writes of padded rows


@dataclass
class PagedAttentionMetadata:
    """Where this step's tokens go and what each request attends to.

    Tensors live on the model's device; the host lists are what the eager path loops
    over (a CUDA graph never sees them: FULL graphs only serve uniform decode).
    """

    slot_mapping: torch.Tensor  # [num_tokens] long; -1: do not write
    block_tables: torch.Tensor  # [num_reqs, width] long; width * block_size >= longest seq
    seq_lens: torch.Tensor  # [num_reqs] long; tokens in the cache after this step (0 for padding)
    query_lens: list[int]  # new tokens per request, host side
    seq_lens_host: list[int]
    uniform_decode: bool  # every request computes exactly one token

    @property
    def num_reqs(self) -> int:
        return len(self.query_lens)


# ANCHOR: allocate_paged_kv_caches
def allocate_paged_kv_caches(
    num_layers: int,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> list[torch.Tensor]:
    """One `[2, num_blocks + scratch, block_size, num_kv_heads, head_dim]` tensor per layer."""
    shape = (2, num_blocks + SCRATCH_BLOCKS, block_size, num_kv_heads, head_dim)
    return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]


# ANCHOR_END: allocate_paged_kv_caches


# ANCHOR: write_kv
def write_kv(
    kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Scatter the new keys and values into their slots; -1 slots land in the scratch block."""
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    keys = kv_cache[0].view(-1, num_kv_heads, head_dim)
    values = kv_cache[1].view(-1, num_kv_heads, head_dim)
    scratch = keys.shape[0] - 1  # the last slot of the scratch block
    slots = torch.where(slot_mapping < 0, torch.full_like(slot_mapping, scratch), slot_mapping)
    keys.index_copy_(0, slots, k)
    values.index_copy_(0, slots, v)


# ANCHOR_END: write_kv


def _group_queries(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """[n, H, D] -> [Hkv, G * n, D]: the G query heads sharing a KV head become rows."""
    n, num_heads, head_dim = q.shape
    group = num_heads // num_kv_heads
    return (
        q.view(n, num_kv_heads, group, head_dim)
        .permute(1, 2, 0, 3)
        .reshape(num_kv_heads, group * n, head_dim)
    )


def _ungroup(out: torch.Tensor, n: int, num_heads: int) -> torch.Tensor:
    """Inverse of `_group_queries`: [Hkv, G * n, D] -> [n, H, D]."""
    num_kv_heads, _, head_dim = out.shape
    group = num_heads // num_kv_heads
    return (
        out.view(num_kv_heads, group, n, head_dim)
        .permute(2, 0, 1, 3)
        .reshape(n, num_heads, head_dim)
    )


class PagedAttentionBackend(AttentionBackend):
    name = "paged-torch"
    cudagraph_support = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE

    def __init__(self, scale: float | None = None) -> None:
        self.scale = scale  # None: 1 / sqrt(head_dim)

    # ANCHOR: paged_forward
    def forward(self, q, k, v, kv_cache, metadata: PagedAttentionMetadata) -> torch.Tensor:
        if kv_cache is None:
            raise RuntimeError("the paged backend needs a KV cache tensor bound to the layer")
        self.write_kv(kv_cache, k, v, metadata.slot_mapping[: k.shape[0]])
        if metadata.uniform_decode:
            return self._decode(q, kv_cache, metadata)
        return self._varlen(q, kv_cache, metadata)

    def write_kv(self, kv_cache, k, v, slot_mapping) -> None:
        write_kv(kv_cache, k, v, slot_mapping)

    # ANCHOR_END: paged_forward

    # ANCHOR: paged_decode
    def _decode(
        self, q: torch.Tensor, kv_cache: torch.Tensor, md: PagedAttentionMetadata
    ) -> torch.Tensor:
        """One new token per request: gather every request's blocks at once."""
        num_reqs, num_heads, head_dim = q.shape
        num_kv_heads, block_size = kv_cache.shape[3], kv_cache.shape[2]
        group = num_heads // num_kv_heads
        tables = md.block_tables[:num_reqs]
        width = tables.shape[1] * block_size
        # Gather every request's blocks:
        # [reqs * blocks, block_size, Hkv, D] -> [reqs, Hkv, width, D].
        # (index_select, not kv_cache[0][tables]: advanced indexing is ~1000x slower on CPU.)
        flat_tables = tables.reshape(-1)
        keys = (
            kv_cache[0]
            .index_select(0, flat_tables)
            .view(num_reqs, width, num_kv_heads, head_dim)
            .transpose(1, 2)
        )
        values = (
            kv_cache[1]
            .index_select(0, flat_tables)
            .view(num_reqs, width, num_kv_heads, head_dim)
            .transpose(1, 2)
        )
        queries = q.view(num_reqs, num_kv_heads, group, head_dim)
        # Positions at or past a request's length hold other requests' data (or nothing):
        # mask them. A padded row (length 0) keeps position 0 so its softmax stays finite.
        lengths = md.seq_lens[:num_reqs].clamp(min=1)
        visible = torch.arange(width, device=q.device).unsqueeze(0) < lengths.unsqueeze(1)
        out = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=visible[:, None, None, :], scale=self.scale
        )
        return out.reshape(num_reqs, num_heads, head_dim)

    # ANCHOR_END: paged_decode

    # ANCHOR: paged_varlen
    def _varlen(
        self, q: torch.Tensor, kv_cache: torch.Tensor, md: PagedAttentionMetadata
    ) -> torch.Tensor:
        """Requests of any query length (prefill chunks and decodes mixed), one at a time."""
        num_heads = q.shape[1]
        num_kv_heads, block_size, head_dim = kv_cache.shape[3], kv_cache.shape[2], kv_cache.shape[4]
        group = num_heads // num_kv_heads
        out = torch.zeros_like(q)  # rows past the real tokens (padding) stay zero
        start = 0
        for i, (q_len, seq_len) in enumerate(zip(md.query_lens, md.seq_lens_host)):
            if q_len == 0:
                continue
            num_blocks = -(-seq_len // block_size)
            blocks = md.block_tables[i, :num_blocks]
            # [blocks, block_size, Hkv, D] -> [Hkv, seq_len, D]
            keys = (
                kv_cache[0]
                .index_select(0, blocks)
                .reshape(-1, num_kv_heads, head_dim)[:seq_len]
                .transpose(0, 1)
            )
            values = (
                kv_cache[1]
                .index_select(0, blocks)
                .reshape(-1, num_kv_heads, head_dim)[:seq_len]
                .transpose(0, 1)
            )
            queries = _group_queries(q[start : start + q_len], num_kv_heads)
            mask = None
            if q_len > 1:
                # The new tokens are the last q_len of the sequence: token j sits at
                # position seq_len - q_len + j and sees keys 0 .. that position.
                q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device).unsqueeze(1)
                mask = (torch.arange(seq_len, device=q.device).unsqueeze(0) <= q_pos).repeat(
                    group, 1
                )
            attended = F.scaled_dot_product_attention(
                queries, keys, values, attn_mask=mask, scale=self.scale
            )
            out[start : start + q_len] = _ungroup(attended, q_len, num_heads)
            start += q_len
        return out

    # ANCHOR_END: paged_varlen
