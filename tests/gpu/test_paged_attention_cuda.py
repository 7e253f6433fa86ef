"""The Triton paged-attention kernels against the plain torch path (GPU-REQ).

The cache-write and decode kernels, with float32 and bf16 caches and several head
groupings, and the decode kernel under every split plan (1 to 16 slices, empty slices
and padded rows included), give what PagedAttentionBackend gives on the same inputs.
The CPU side, and the choice of a plan: tests/engine/test_paged_attention.py.
"""

from __future__ import annotations

import pytest
import torch

from mini_vllm.attention.paged import (
    PagedAttentionBackend,
    PagedAttentionMetadata,
    allocate_paged_kv_caches,
)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("heads, kv_heads", [(9, 3), (32, 8), (4, 4)])
def test_triton_decode_kernels_match_the_torch_path(dtype, tol, heads, kv_heads):
    """The two Triton kernels (cache write, paged decode) against the plain torch path.

    Tolerance: float32 accumulations in a different order (online softmax) stay within
    1e-5; bf16 inputs and output round to 8 mantissa bits, so 2e-2.
    """
    from mini_vllm.kernels.paged_attention import TritonPagedAttentionBackend, triton_available

    assert triton_available(), "Triton is needed on a CUDA machine"
    torch.manual_seed(0)
    dim, block, num_blocks, reqs = 64, 16, 40, 6
    caches = [
        allocate_paged_kv_caches(1, num_blocks, block, kv_heads, dim, dtype, "cuda")[0]
        for _ in range(2)
    ]
    caches[0].normal_()
    caches[1].copy_(caches[0])
    lens = torch.tensor([1, 17, 64, 100, 3, 0], device="cuda")  # the last row is padding
    tables = torch.randint(0, num_blocks, (reqs, 8), device="cuda")
    slots = torch.tensor(
        [
            int(tables[i, (n - 1) // block]) * block + (n - 1) % block if n else -1
            for i, n in enumerate(lens.tolist())
        ],
        device="cuda",
    )
    q = torch.randn(reqs, heads, dim, device="cuda", dtype=dtype)
    k = torch.randn(reqs, kv_heads, dim, device="cuda", dtype=dtype)
    v = torch.randn(reqs, kv_heads, dim, device="cuda", dtype=dtype)
    md = PagedAttentionMetadata(slots, tables, lens, [1] * reqs, lens.tolist(), uniform_decode=True)
    fast = TritonPagedAttentionBackend().forward(q, k, v, caches[0], md)
    mixed = PagedAttentionMetadata(
        slots, tables, lens, [1] * reqs, lens.tolist(), uniform_decode=False
    )
    caches.append(caches[1].clone())
    TritonPagedAttentionBackend().forward(q, k, v, caches[2], mixed)  # the write kernel alone
    slow = PagedAttentionBackend().forward(q, k, v, caches[1], md)
    torch.testing.assert_close(caches[0], caches[1])  # the same slots written, scratch included
    torch.testing.assert_close(caches[2], caches[1])
    torch.testing.assert_close(fast[:-1].float(), slow[:-1].float(), rtol=tol, atol=tol)
    assert torch.isfinite(fast).all()


# 1, 2 and 16 slices, and tiles of 16 to 64 tokens.
DECODE_PLANS = [((16, 1), 1), ((64, 1), 1), ((32, 4), 2), ((64, 4), 16)]


@pytest.mark.gpu
@pytest.mark.parametrize("plan", DECODE_PLANS, ids=lambda p: f"{p[0]}-{p[1]}")
@pytest.mark.parametrize("heads, kv_heads", [(9, 3), (32, 8), (4, 4)])
def test_decode_kernels_match_the_torch_path_for_every_plan(plan, heads, kv_heads):
    """The decode kernel with any number of slices and their merge gives the torch path's
    answer, empty slices included.

    Contexts of 1 and 2 tokens leave most of 16 slices empty; 0 is a padded row.
    Tolerance: bf16 inputs and output, float32 accumulation in another order, the
    probabilities rounded to bf16 for the tensor cores: 2e-2.
    """
    from mini_vllm.kernels.paged_attention import DecodePlan, triton_paged_decode

    plan = DecodePlan(*plan)
    torch.manual_seed(plan.splits)
    dim, block, num_blocks = 64, 16, 128
    lens = torch.tensor([1, 2, 17, 128, 300, 0], device="cuda")
    reqs = len(lens)
    caches = [
        allocate_paged_kv_caches(1, num_blocks, block, kv_heads, dim, torch.bfloat16, "cuda")[0]
        for _ in range(2)
    ]
    caches[0].normal_()
    caches[1].copy_(caches[0])
    # Each request owns its own 20 blocks, so no request reads a slot another one writes.
    tables = torch.arange(reqs * 20, device="cuda").view(reqs, 20)
    slots = torch.tensor(
        [
            int(tables[i, (n - 1) // block]) * block + (n - 1) % block if n else -1
            for i, n in enumerate(lens.tolist())
        ],
        device="cuda",
    )
    q = torch.randn(reqs, heads, dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(reqs, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(reqs, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
    fast = triton_paged_decode(q, k, v, caches[0], tables, lens, slots, None, plan=plan)
    md = PagedAttentionMetadata(slots, tables, lens, [1] * reqs, lens.tolist(), uniform_decode=True)
    slow = PagedAttentionBackend().forward(q, k, v, caches[1], md)
    torch.testing.assert_close(
        caches[0], caches[1]
    )  # the new keys and values stored once, in their slots
    torch.testing.assert_close(fast[:-1].float(), slow[:-1].float(), rtol=2e-2, atol=2e-2)
    assert torch.isfinite(fast).all()
    for wrong in (plan._replace(splits=3), DecodePlan((64, 1), 0)):
        with pytest.raises(ValueError, match="power of two"):
            triton_paged_decode(q, k, v, caches[0], tables, lens, slots, None, plan=wrong)


# (new tokens, tokens in the cache after the step) per request: decodes, a whole prompt,
# later chunks of long prompts, a chunk of one token, short and long contexts mixed.
MIXED_STEP = [(1, 37), (17, 17), (64, 100), (2, 2), (1, 1), (100, 250), (1, 80), (300, 700)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize(
    "heads, kv_heads, dim", [(9, 3, 64), (32, 8, 64), (4, 4, 32), (32, 8, 128)]
)
def test_unified_kernel_matches_the_reference_loop(dtype, tol, heads, kv_heads, dim):
    """The mixed-step kernel (every request in one launch) against the readable loop of
    `PagedAttentionBackend.reference_forward`, and the torch path's batched version too;
    rows past the real tokens (the padding of a graph size) come back zero."""
    from mini_vllm.kernels.paged_attention import TritonPagedAttentionBackend

    torch.manual_seed(0)
    block, num_blocks, padding = 16, 160, 7
    cache = allocate_paged_kv_caches(1, num_blocks, block, kv_heads, dim, dtype, "cuda")[0]
    cache.normal_()
    permutation = torch.randperm(num_blocks).tolist()
    tables, slots = [], []
    for query_len, seq_len in MIXED_STEP:
        table = [permutation.pop() for _ in range(-(-seq_len // block))]
        tables.append(table + [0] * (44 - len(table)))
        slots += [
            table[p // block] * block + p % block for p in range(seq_len - query_len, seq_len)
        ]
    num_tokens = sum(q for q, _ in MIXED_STEP)
    md = PagedAttentionMetadata(
        torch.tensor(slots + [-1] * padding, device="cuda"),
        torch.tensor(tables, device="cuda"),
        torch.tensor([s for _, s in MIXED_STEP], device="cuda"),
        [q for q, _ in MIXED_STEP],
        [s for _, s in MIXED_STEP],
        uniform_decode=False,
    )
    q = torch.randn(num_tokens + padding, heads, dim, device="cuda", dtype=dtype)
    k = torch.randn(num_tokens + padding, kv_heads, dim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    reference_cache = cache.clone()
    fast = TritonPagedAttentionBackend().forward(q, k, v, cache, md)
    batched = PagedAttentionBackend().forward(q, k, v, reference_cache, md)
    # The same slots written; the scratch block (the last) takes the padded rows' writes
    # in whatever order each writer runs them.
    torch.testing.assert_close(cache[:, :-1], reference_cache[:, :-1])
    reference = PagedAttentionBackend().reference_forward(q, reference_cache, md)
    torch.testing.assert_close(fast.float(), reference.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(batched.float(), reference.float(), rtol=tol, atol=tol)
    assert fast[num_tokens:].eq(0).all()
