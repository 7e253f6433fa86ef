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
- a mixed step (prefill chunks of any length beside decodes): the requests are split as
  vLLM's `split_decodes_and_prefills` does (vllm/v1/attention/backends/utils.py). The
  decodes run as above, all at once; the prefill chunks run together in one more call,
  each chunk's queries padded to the longest chunk, with a causal mask offset by the
  tokens each request already has in the cache. Index arithmetic on the host arrays,
  no loop over requests; it runs eagerly (or between piecewise graphs).
Hence `cudagraph_support = UNIFORM_SINGLE_TOKEN_DECODE`.

`reference_forward` keeps the readable version of the mixed step: one attention call
per request, a Python loop. The tests hold the batched path to it.

On CUDA, where the kernel table has them (mini_vllm/_custom_ops.py), the model runner
uses `TritonPagedAttentionBackend` (mini_vllm/kernels/paged_attention.py), which extends
this one: its decode, its mixed steps (one kernel for every request, whatever its query
length) and its cache writes are Triton kernels.
"""

from __future__ import annotations

from collections.abc import Sequence as SequenceT
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from mini_vllm.attention.backend import AttentionBackend
from mini_vllm.config.compilation import AttentionCGSupport

__all__ = [
    "PagedAttentionBackend",
    "MixedSplit",
    "PagedAttentionMetadata",
    "allocate_paged_kv_caches",
    "SCRATCH_BLOCKS",
]

SCRATCH_BLOCKS = 1  # extra block per cache tensor that absorbs writes of padded rows


@dataclass
class PagedAttentionMetadata:
    """Where this step's tokens go and what each request attends to.

    Tensors live on the model's device; the host lists are what the mixed-step index
    arithmetic reads (a CUDA graph never sees them: FULL graphs only serve uniform decode).
    """

    slot_mapping: torch.Tensor  # [num_tokens] long; -1: do not write
    block_tables: torch.Tensor  # [num_reqs, width] long; width * block_size >= longest seq
    seq_lens: torch.Tensor  # [num_reqs] long; tokens in the cache after this step (0 for padding)
    query_lens: SequenceT[int]  # new tokens per request, host side (a list or an array)
    seq_lens_host: SequenceT[int]
    uniform_decode: bool  # every request computes exactly one token
    # [num_reqs + 1] long on the device: where each request's tokens start, then the end
    # (vLLM: query_start_loc). None: made here from query_lens.
    query_start_loc: torch.Tensor | None = None
    max_query_len: int = field(init=False)
    max_seq_len: int = field(init=False)

    def __post_init__(self) -> None:
        self.max_query_len = int(np.max(self.query_lens, initial=0))
        self.max_seq_len = int(np.max(self.seq_lens_host, initial=0))
        if self.query_start_loc is None:
            starts = np.concatenate(([0], np.cumsum(self.query_lens, dtype=np.int64)))
            self.query_start_loc = torch.from_numpy(starts).to(self.seq_lens.device)
        self._split: MixedSplit | None = None

    @property
    def num_reqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_actual_tokens(self) -> int:
        """Tokens of real requests (a padded step has more rows than this)."""
        return int(np.sum(self.query_lens))

    def split(self, num_rows: int) -> MixedSplit:
        """This step's decodes and prefill chunks as index tensors for a query of
        `num_rows` rows (padding included), made once a step: every layer reads the same."""
        if self._split is None or self._split.num_rows != num_rows:
            self._split = MixedSplit.build(
                self.query_lens, self.seq_lens_host, num_rows, self.seq_lens.device
            )
        return self._split


# ANCHOR: mixed_split
@dataclass(frozen=True)
class MixedSplit:
    """A mixed step's requests in two groups, as index tensors (vLLM:
    `split_decodes_and_prefills`). A request with one new token is a decode, whatever
    came before (the last token of a prompt too): it sees every cached key."""

    decode_reqs: torch.Tensor  # [D] request indices
    decode_rows: torch.Tensor  # [D] the flat row of each decode's token
    prefill_reqs: torch.Tensor  # [P] requests with more than one new token
    # [P, longest chunk]: the flat row of each chunk's i-th token; past a chunk's end,
    # the spare row `num_rows` (the output has one more row than the query, unread).
    prefill_rows: torch.Tensor
    # [P, longest chunk]: the position of each chunk's i-th token in its sequence; every
    # key at or before it is visible.
    prefill_positions: torch.Tensor
    prefill_width: int  # cached tokens of the longest prefilling request
    num_rows: int  # rows of the step's query, padding included

    @classmethod
    def build(
        cls, query_lens: list[int], seq_lens: list[int], num_rows: int, device: torch.device
    ) -> MixedSplit:
        query_lens_np = np.asarray(query_lens, dtype=np.int64)
        seq_lens_np = np.asarray(seq_lens, dtype=np.int64)
        starts = np.cumsum(query_lens_np) - query_lens_np
        decodes = np.flatnonzero(query_lens_np == 1)
        prefills = np.flatnonzero(query_lens_np > 1)
        longest = int(query_lens_np[prefills].max()) if prefills.size else 0
        offsets = np.arange(longest)
        inside = offsets[None, :] < query_lens_np[prefills, None]
        rows = np.where(inside, starts[prefills, None] + offsets[None, :], num_rows)
        cached_before = seq_lens_np[prefills] - query_lens_np[prefills]
        positions = cached_before[:, None] + offsets[None, :]
        width = int(seq_lens_np[prefills].max()) if prefills.size else 0

        def to_device(array: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(array)).to(device, non_blocking=True)

        return cls(
            to_device(decodes),
            to_device(starts[decodes]),
            to_device(prefills),
            to_device(rows),
            to_device(positions),
            width,
            num_rows,
        )


# ANCHOR_END: mixed_split


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
            num_reqs = q.shape[0]
            return self._decode(
                q, kv_cache, metadata.block_tables[:num_reqs], metadata.seq_lens[:num_reqs]
            )
        return self._mixed(q, kv_cache, metadata)

    def write_kv(self, kv_cache, k, v, slot_mapping) -> None:
        write_kv(kv_cache, k, v, slot_mapping)

    # ANCHOR_END: paged_forward

    # ANCHOR: paged_decode
    def _decode(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        tables: torch.Tensor,
        seq_lens: torch.Tensor,
    ) -> torch.Tensor:
        """One new token per request: gather every request's blocks at once."""
        num_reqs, num_heads, head_dim = q.shape
        num_kv_heads, block_size = kv_cache.shape[3], kv_cache.shape[2]
        group = num_heads // num_kv_heads
        width = tables.shape[1] * block_size
        keys, values = _gather_blocks(kv_cache, tables)  # [reqs, Hkv, width, D]
        queries = q.view(num_reqs, num_kv_heads, group, head_dim)
        # Positions at or past a request's length hold other requests' data (or nothing):
        # mask them. A padded row (length 0) keeps position 0 so its softmax stays finite.
        lengths = seq_lens.clamp(min=1)
        visible = torch.arange(width, device=q.device).unsqueeze(0) < lengths.unsqueeze(1)
        out = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=visible[:, None, None, :], scale=self.scale
        )
        return out.reshape(num_reqs, num_heads, head_dim)

    # ANCHOR_END: paged_decode

    # ANCHOR: paged_mixed
    def _mixed(
        self, q: torch.Tensor, kv_cache: torch.Tensor, md: PagedAttentionMetadata
    ) -> torch.Tensor:
        """Prefill chunks of any length beside decodes: two batched calls, no loop."""
        num_tokens, num_heads, head_dim = q.shape
        num_kv_heads, block_size = kv_cache.shape[3], kv_cache.shape[2]
        group = num_heads // num_kv_heads
        split = md.split(num_tokens)
        # One spare row past the tokens: padded query slots of short chunks land there.
        # Rows past the real tokens (padding of a piecewise graph's size) stay zero.
        out = q.new_zeros(num_tokens + 1, num_heads, head_dim)
        if split.decode_reqs.numel():
            decoded = self._decode(
                q.index_select(0, split.decode_rows),
                kv_cache,
                md.block_tables.index_select(0, split.decode_reqs),
                md.seq_lens.index_select(0, split.decode_reqs),
            )
            out.index_copy_(0, split.decode_rows, decoded)
        if split.prefill_reqs.numel():
            num_prefills, longest = split.prefill_rows.shape
            num_blocks = -(-split.prefill_width // block_size)
            tables = md.block_tables.index_select(0, split.prefill_reqs)[:, :num_blocks]
            keys, values = _gather_blocks(kv_cache, tables)  # [P, Hkv, width, D]
            # [P * longest, H, D] -> [P, Hkv, G * longest, D]: a KV head's query heads
            # and tokens become one run of rows.
            padded_q = torch.cat([q, q.new_zeros(1, num_heads, head_dim)])
            queries = (
                padded_q.index_select(0, split.prefill_rows.reshape(-1))
                .view(num_prefills, longest, num_kv_heads, group, head_dim)
                .permute(0, 2, 3, 1, 4)
                .reshape(num_prefills, num_kv_heads, group * longest, head_dim)
            )
            # Token i of a chunk sees the keys at or before its own position.
            key_positions = torch.arange(num_blocks * block_size, device=q.device)
            visible = key_positions.view(1, 1, -1) <= split.prefill_positions.unsqueeze(-1)
            visible = visible.unsqueeze(1).expand(-1, group, -1, -1)
            attended = F.scaled_dot_product_attention(
                queries,
                keys,
                values,
                attn_mask=visible.reshape(num_prefills, 1, group * longest, -1),
                scale=self.scale,
            )
            attended = (
                attended.view(num_prefills, num_kv_heads, group, longest, head_dim)
                .permute(0, 3, 1, 2, 4)
                .reshape(num_prefills * longest, num_heads, head_dim)
            )
            out.index_copy_(0, split.prefill_rows.reshape(-1), attended)
        return out[:num_tokens]

    # ANCHOR_END: paged_mixed

    # ANCHOR: paged_reference
    def reference_forward(
        self, q: torch.Tensor, kv_cache: torch.Tensor, md: PagedAttentionMetadata
    ) -> torch.Tensor:
        """The readable mixed step: one request at a time (the cache already written).

        What `_mixed` and the Triton kernel compute, in a loop a student can follow."""
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

    # ANCHOR_END: paged_reference


def _gather_blocks(
    kv_cache: torch.Tensor, tables: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of each table row's blocks, `[rows, Hkv, blocks * block_size, D]`.

    (index_select, not kv_cache[0][tables]: advanced indexing is ~1000x slower on CPU.)"""
    rows, num_blocks = tables.shape
    block_size, num_kv_heads, head_dim = kv_cache.shape[2:]
    flat_tables = tables.reshape(-1)
    width = num_blocks * block_size
    keys = kv_cache[0].index_select(0, flat_tables).view(rows, width, num_kv_heads, head_dim)
    values = kv_cache[1].index_select(0, flat_tables).view(rows, width, num_kv_heads, head_dim)
    return keys.transpose(1, 2), values.transpose(1, 2)
