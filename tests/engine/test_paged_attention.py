"""Paged attention equals attention over a contiguous cache, for prefill, decode and mixes.

The Triton kernels against this path (GPU-REQ): tests/gpu/test_paged_attention_cuda.py.
"""

import math

import pytest
import torch

from mini_vllm.attention.contiguous import (
    ContiguousAttentionBackend,
    ContiguousAttentionMetadata,
    allocate_contiguous_kv_caches,
)
from mini_vllm.attention.paged import (
    PagedAttentionBackend,
    PagedAttentionMetadata,
    allocate_paged_kv_caches,
)
from mini_vllm.engine.block_manager import slot_mapping

HEADS, KV_HEADS, DIM, BLOCK = 4, 2, 8, 4


def reference_attention(q, keys, values, q_pos):
    """One query vector per head over keys 0..q_pos, with explicit head repetition."""
    group = HEADS // KV_HEADS
    k = keys[: q_pos + 1].repeat_interleave(group, dim=1)
    v = values[: q_pos + 1].repeat_interleave(group, dim=1)
    scores = torch.einsum("hd,thd->ht", q, k) / math.sqrt(DIM)
    return torch.einsum("ht,thd->hd", scores.softmax(-1), v)


@pytest.fixture
def seqs():
    torch.manual_seed(0)
    return [
        dict(
            q=torch.randn(12, HEADS, DIM),
            k=torch.randn(12, KV_HEADS, DIM),
            v=torch.randn(12, KV_HEADS, DIM),
            table=table,
        )
        for table in ([3, 7, 1], [5, 0, 2])
    ]


def run_step(backend, cache, seqs, spans, uniform, pad_tokens=0):
    """spans: per sequence (start, end) of the new tokens this step."""
    q = torch.cat(
        [s["q"][a:b] for s, (a, b) in zip(seqs, spans)] + [torch.zeros(pad_tokens, HEADS, DIM)]
    )
    k = torch.cat(
        [s["k"][a:b] for s, (a, b) in zip(seqs, spans)] + [torch.ones(pad_tokens, KV_HEADS, DIM)]
    )
    v = torch.cat(
        [s["v"][a:b] for s, (a, b) in zip(seqs, spans)] + [torch.ones(pad_tokens, KV_HEADS, DIM)]
    )
    slots = (
        sum((slot_mapping(s["table"], a, b, BLOCK) for s, (a, b) in zip(seqs, spans)), [])
        + [-1] * pad_tokens
    )
    tables = torch.tensor([s["table"] for s in seqs] + [[0, 0, 0]] * (pad_tokens if uniform else 0))
    lens = [b for _, b in spans] + [0] * (pad_tokens if uniform else 0)
    qlens = [b - a for a, b in spans] + [1] * (pad_tokens if uniform else 0)
    md = PagedAttentionMetadata(
        torch.tensor(slots), tables, torch.tensor(lens), qlens, lens, uniform
    )
    return backend.forward(q, k, v, cache, md)


def check(out, seqs, spans):
    row = 0
    for s, (a, b) in zip(seqs, spans):
        for pos in range(a, b):
            expected = reference_attention(s["q"][pos], s["k"], s["v"], pos)
            torch.testing.assert_close(out[row], expected, rtol=1e-5, atol=1e-5)
            row += 1


def test_paged_prefill_then_decode_then_chunk_match_reference(seqs):
    cache = allocate_paged_kv_caches(1, 8, BLOCK, KV_HEADS, DIM, torch.float32, "cpu")[0]
    backend = PagedAttentionBackend()
    for spans, uniform in [
        ([(0, 6), (0, 3)], False),
        ([(6, 7), (3, 4)], True),
        ([(7, 8), (4, 9)], False),
    ]:
        check(run_step(backend, cache, seqs, spans, uniform), seqs, spans)


def test_padded_rows_write_only_the_scratch_block_and_stay_finite(seqs):
    cache = allocate_paged_kv_caches(1, 8, BLOCK, KV_HEADS, DIM, torch.float32, "cpu")[0]
    backend = PagedAttentionBackend()
    run_step(backend, cache, seqs, [(0, 5), (0, 5)], uniform=False, pad_tokens=3)
    before = cache[:, :8].clone()
    out = run_step(backend, cache, seqs, [(5, 6), (5, 6)], uniform=True, pad_tokens=2)
    check(out[:2], seqs, [(5, 6), (5, 6)])
    assert torch.isfinite(out).all()
    # Only the two real tokens changed the real blocks; padding went to the scratch block.
    # Position 5 is block 7 offset 1 for the first sequence, block 0 offset 1 for the second.
    changed = (cache[:, :8] != before).any(dim=-1).any(dim=-1).any(dim=0).nonzero().tolist()
    assert sorted(map(tuple, changed)) == [(0, 1), (7, 1)]


def test_paged_backend_equals_contiguous_backend_inside_the_model():
    from mini_vllm.config.compilation import CUDAGraphMode
    from mini_vllm.forward_context import set_forward_context
    from mini_vllm.layers.attention import bind_kv_caches
    from mini_vllm.models.loader import load_model

    model, _, cfg = load_model("tiny", seed=3)
    tokens = torch.randint(0, cfg.vocab_size, (21,))
    with torch.inference_mode():
        caches = allocate_contiguous_kv_caches(
            cfg.num_hidden_layers,
            1,
            21,
            cfg.num_key_value_heads,
            cfg.head_dim,
            torch.float32,
            "cpu",
        )
        bind_kv_caches(model, ContiguousAttentionBackend(), caches)
        with set_forward_context(
            CUDAGraphMode.NONE, attn_metadata=ContiguousAttentionMetadata.prefill(1, 21)
        ):
            expected = model(tokens, torch.arange(21))
        table = [6, 2, 9, 4, 0, 8]
        paged = allocate_paged_kv_caches(
            cfg.num_hidden_layers,
            10,
            BLOCK,
            cfg.num_key_value_heads,
            cfg.head_dim,
            torch.float32,
            "cpu",
        )
        bind_kv_caches(model, PagedAttentionBackend(), paged)
        outs = []
        for a, b in [(0, 13), (13, 14), (14, 20), (20, 21)]:  # prefill, decode, chunk, decode
            md = PagedAttentionMetadata(
                torch.tensor(slot_mapping(table, a, b, BLOCK)),
                torch.tensor([table]),
                torch.tensor([b]),
                [b - a],
                [b],
                uniform_decode=(b - a == 1),
            )
            with set_forward_context(CUDAGraphMode.NONE, attn_metadata=md):
                outs.append(model(tokens[a:b], torch.arange(a, b)))
    torch.testing.assert_close(torch.cat(outs), expected, rtol=1e-5, atol=1e-5)


def test_split_count_follows_batch_head_dim_and_longest_possible_context():
    """Slices only pay for a small batch over a long context (the kernels are GPU-REQ;
    the choice is plain arithmetic and is checked here)."""
    from mini_vllm.kernels.paged_attention import (
        GROUPED_TILE,
        MANY_SLICES_TILE,
        SINGLE_PASS_MAX_CONTEXT,
        DecodePlan,
        decode_num_splits,
        decode_plan,
    )

    assert decode_num_splits(1, 3, 64) == 16  # SmolLM2 at batch 1, context unknown: the cap
    assert decode_num_splits(1, 3, 64, max_context=4096) == 16
    assert decode_num_splits(1, 3, 64, max_context=SINGLE_PASS_MAX_CONTEXT) == 1  # one pass
    assert decode_num_splits(1, 3, 64, max_context=SINGLE_PASS_MAX_CONTEXT + 16) == 16
    assert decode_num_splits(8, 3, 64, max_context=4096) == 16  # 24 pairs: the cap
    assert decode_num_splits(32, 3, 64, max_context=4096) == 8  # 96 pairs, 768 programs
    assert decode_num_splits(8, 8, 64, max_context=4096) == 16  # Llama-3.2-1B at batch 8
    assert decode_num_splits(32, 8, 64, max_context=4096) == 4  # 1024 programs
    assert decode_num_splits(32, 8, 128, max_context=4096) == 2  # 8B heads: 512 programs
    assert decode_num_splits(64, 8, 128, max_context=4096) == 1  # 512 pairs fill the GPU
    assert decode_num_splits(1024, 8, 128, max_context=4096) == 1
    assert decode_plan(32, 8, 128, 4096) == DecodePlan(GROUPED_TILE, 2)
    assert decode_plan(1, 3, 64, 4096) == DecodePlan(MANY_SLICES_TILE, 16)
