"""Phase 00's attention backend: one contiguous KV cache per layer, sequences in lockstep.

vLLM counterpart: none any more (vLLM pages its cache from the start; Phase 02 gets
there). The closest relatives are gpt-fast (generate.py, `KVCache.update`: a static
cache written at `input_pos`) and Hugging Face's `StaticCache`
(transformers/cache_utils.py). The GQA trick below follows what FlashAttention and
vLLM's kernels do: query heads are grouped by the KV head they read, so the cache is
never copied per query head.

Cache layout per layer: `[2, batch, max_len, num_kv_heads, head_dim]` (index 0 = keys,
1 = values). Every sequence in the batch has the same length, so one metadata object
(`start_pos`, `num_new_tokens`) says where all the new tokens go. Tokens arrive
flattened sequence by sequence: `T = batch * num_new_tokens`.

Python integers in the metadata decide tensor shapes here, so this backend cannot be
captured in a CUDA graph: `cudagraph_support = NEVER`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mini_vllm.attention.backend import AttentionBackend
from mini_vllm.config.compilation import AttentionCGSupport

__all__ = [
    "ContiguousAttentionBackend",
    "ContiguousAttentionMetadata",
    "allocate_contiguous_kv_caches",
]


# ANCHOR: contiguous_metadata
@dataclass(frozen=True)
class ContiguousAttentionMetadata:
    batch_size: int
    start_pos: int  # tokens every sequence already has in the cache
    num_new_tokens: int  # tokens every sequence adds this step (prompt length, then 1)

    @property
    def seq_len(self) -> int:
        return self.start_pos + self.num_new_tokens

    @classmethod
    def prefill(cls, batch_size: int, prompt_len: int) -> ContiguousAttentionMetadata:
        return cls(batch_size, 0, prompt_len)

    @classmethod
    def decode(cls, batch_size: int, start_pos: int) -> ContiguousAttentionMetadata:
        return cls(batch_size, start_pos, 1)


# ANCHOR_END: contiguous_metadata


# ANCHOR: allocate_kv
def allocate_contiguous_kv_caches(
    num_layers: int,
    batch_size: int,
    max_len: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> list[torch.Tensor]:
    """One zeroed `[2, batch, max_len, num_kv_heads, head_dim]` tensor per layer."""
    shape = (2, batch_size, max_len, num_kv_heads, head_dim)
    return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]


# ANCHOR_END: allocate_kv


class ContiguousAttentionBackend(AttentionBackend):
    name = "contiguous"
    cudagraph_support = AttentionCGSupport.NEVER

    def __init__(self, scale: float | None = None) -> None:
        # None: the usual 1/sqrt(head_dim), read from q's shape.
        self.scale = scale

    def forward(self, q, k, v, kv_cache, metadata: ContiguousAttentionMetadata):
        if kv_cache is None:
            raise RuntimeError("the contiguous backend needs a KV cache tensor bound to the layer")
        batch, start, new = metadata.batch_size, metadata.start_pos, metadata.num_new_tokens
        end = start + new
        if q.shape[0] != batch * new:
            raise ValueError(f"metadata says {batch} x {new} new tokens, got {q.shape[0]}")
        if end > kv_cache.shape[2]:
            raise ValueError(f"KV cache holds {kv_cache.shape[2]} positions, step needs {end}")
        num_heads, head_dim = q.shape[1], q.shape[2]
        num_kv_heads = k.shape[1]
        group = num_heads // num_kv_heads

        # ANCHOR: kv_write
        # The new keys and values go to positions [start, end) of every sequence, in
        # one copy; nothing before them is touched, so earlier steps are never redone.
        new_kv = torch.stack((k, v)).view(2, batch, new, num_kv_heads, head_dim)
        kv_cache.narrow(2, start, new).copy_(new_kv)
        # ANCHOR_END: kv_write

        # ANCHOR: gqa
        # The filled part of the cache as [2, batch, kv_heads, seq_len, head_dim]: a
        # view, not a copy, and never one copy per query head.
        cached = kv_cache.narrow(2, 0, end).transpose(2, 3)
        keys, values = cached[0], cached[1]
        if new == 1:
            # Decode: query head h reads KV head h // group (the order of Hugging
            # Face's `repeat_kv`), so [batch, heads, D] viewed as
            # [batch, kv_heads, group, D] lines every query head up with its KV head
            # and one attention call broadcasts over KV heads. No mask: the one new
            # token may see the whole cache.
            queries = q.view(batch, num_kv_heads, group, head_dim)
            out = F.scaled_dot_product_attention(queries, keys, values, scale=self.scale)
            # reshape, not view: some CUDA kernels return a transposed layout.
            return out.reshape(batch, num_heads, head_dim)
        # Prefill (or several new tokens): rows of the folded query are (group, token)
        # pairs, and each token may see keys up to its own position.
        queries = (
            q.view(batch, new, num_kv_heads, group, head_dim)
            .permute(0, 2, 3, 1, 4)
            .reshape(batch, num_kv_heads, group * new, head_dim)
        )
        q_pos = torch.arange(start, end, device=q.device).unsqueeze(1)
        k_pos = torch.arange(end, device=q.device).unsqueeze(0)
        mask = (k_pos <= q_pos).repeat(group, 1)  # rows follow the (group, token) order
        out = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=mask, scale=self.scale
        )
        # [batch, kv_heads, group * new, D] -> [batch * new, heads, D]
        out = out.view(batch, num_kv_heads, group, new, head_dim).permute(0, 3, 1, 2, 4)
        return out.reshape(batch * new, num_heads, head_dim)
        # ANCHOR_END: gqa
