"""The fusion pass's GPU side (GPU-REQ; its CPU side: tests/engine/test_fusion.py).

The Triton GEMV prologues (RMSNorm with or without the residual add, SwiGLU) against the
unfused arithmetic, the SwiGLU op on CUDA against torch, the decode kernels' fused RoPE
against rotating first, and a compiled CUDA engine with the pass against the same engine
without it (same tokens, fewer kernels a decode step).
"""

from __future__ import annotations

import pytest
import torch

from mini_vllm.layers.activation import silu_and_mul_native
from mini_vllm.layers.layernorm import rms_norm_native
from tests.engine.test_compile import GREEDY, make, prompts

# (out, in) of the products a norm or SwiGLU feeds: SmolLM2 and Llama-3.2-1B, and odd sizes.
NORM_SHAPES = [(960, 576), (3072, 576), (3072, 2048), (16384, 2048), (100, 333)]
SILU_SHAPES = [(576, 1536), (2048, 8192), (50, 333)]


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 5, 64])  # the GEMV, then two of the skinny buckets
@pytest.mark.parametrize("out_features, in_features", NORM_SHAPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_gemv_matches_norm_then_product(out_features, in_features, with_residual, rows):
    from mini_vllm.kernels.gemv import triton_rms_norm_gemv

    gen = torch.Generator(device="cuda").manual_seed(in_features)
    x = (torch.randn(rows, in_features, device="cuda", generator=gen) * 3).bfloat16()
    residual = (
        torch.randn(rows, in_features, device="cuda", generator=gen).bfloat16()
        if with_residual
        else None
    )
    g = (torch.rand(in_features, device="cuda", generator=gen) + 0.5).bfloat16()
    w = (
        torch.randn(out_features, in_features, device="cuda", generator=gen) / in_features**0.5
    ).bfloat16()
    got = triton_rms_norm_gemv(x, residual, g, 1e-5, w)
    summed = x if residual is None else x + residual
    # The reference: the same bf16 roundings (torch's add and norm), then a float32 product.
    expected = rms_norm_native(summed, g, 1e-5).float() @ w.float().t()
    if residual is not None:
        got, new_residual = got
        torch.testing.assert_close(
            new_residual, summed, rtol=0, atol=0
        )  # one rounded add, same as torch
    assert got.shape == (rows, out_features) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, rtol=2**-6, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 5, 64])
@pytest.mark.parametrize("out_features, in_features", SILU_SHAPES)
def test_silu_and_mul_gemv_matches_activation_then_product(out_features, in_features, rows):
    from mini_vllm.kernels.gemv import triton_silu_and_mul_gemv

    gen = torch.Generator(device="cuda").manual_seed(in_features)
    gate_up = (torch.randn(rows, 2 * in_features, device="cuda", generator=gen) * 2).bfloat16()
    w = (
        torch.randn(out_features, in_features, device="cuda", generator=gen) / in_features**0.5
    ).bfloat16()
    expected = silu_and_mul_native(gate_up).float() @ w.float().t()
    got = triton_silu_and_mul_gemv(gate_up, w)
    assert got.shape == (rows, out_features)
    torch.testing.assert_close(got.float(), expected, rtol=2**-6, atol=2e-2)


@pytest.mark.gpu
def test_fusion_on_cuda_keeps_the_tokens_and_removes_kernels():
    from mini_vllm import SamplingParams
    from mini_vllm.bench.harness import count_kernels

    results = {}
    for fusion in (False, True):
        llm = make(
            "cuda",
            compilation_mode="vllm_compile",
            cudagraph_mode="full_and_piecewise",
            enable_fusion=fusion,
        )
        tokens = [o.token_ids for o in llm.generate(prompts(), GREEDY, use_tqdm=False)]
        # One decode step of one request (a FULL graph replay): how many kernels it runs.
        llm.engine.add_request(
            prompts(1)[0], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        )
        for _ in range(3):
            llm.engine.step()
        kernels, _ = count_kernels(torch.device("cuda"), llm.engine.step)
        assert llm.engine.runner.last_step.runtime_mode == "FULL"
        results[fusion] = (tokens, llm.engine.runner.graphs.compile_stats.fused_pairs, kernels)
    layers = llm.engine.model.config.num_hidden_layers
    assert results[True][0] == results[False][0]
    assert results[False][1] == 0 and results[True][1] == 4 * layers
    # Each fused pair saves the norm's, the activation's or RoPE's own kernel (the
    # embedding may have shared one with the first norm before).
    assert results[True][2] <= results[False][2] - (4 * layers - 1), (
        results[True][2],
        results[False][2],
    )


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_silu_and_mul_op_on_cuda_matches_torch(rows):
    import mini_vllm.kernels  # noqa: F401  (registers the ops)

    silu_and_mul_op = torch.ops.mini_vllm.silu_and_mul
    gate_up = (torch.randn(rows, 2 * 1536, device="cuda") * 2).bfloat16()
    torch.testing.assert_close(
        silu_and_mul_op(gate_up), silu_and_mul_native(gate_up), rtol=2**-7, atol=2**-7
    )


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, 8])
@pytest.mark.parametrize("num_reqs", [1, 3])
def test_decode_kernels_rotate_like_rotating_first(num_splits, num_reqs):
    from mini_vllm.kernels.paged_attention import DecodePlan, triton_paged_decode
    from mini_vllm.layers.rotary_embedding import RotaryEmbedding

    torch.manual_seed(num_reqs * 10 + num_splits)
    heads, kv_heads, dim, block, blocks_per_seq = 9, 3, 64, 16, 8
    rope = RotaryEmbedding(dim, 512, 100000.0).to("cuda")
    kv_cache = torch.randn(
        2, num_reqs * blocks_per_seq + 1, block, kv_heads, dim, device="cuda"
    ).bfloat16()
    tables = torch.arange(num_reqs * blocks_per_seq, device="cuda", dtype=torch.int64).view(
        num_reqs, -1
    )
    seq_lens = torch.tensor([100, 37, 128][:num_reqs], device="cuda")
    positions = seq_lens - 1
    slots = tables.gather(1, (positions // block)[:, None]).squeeze(1) * block + positions % block
    qkv = torch.randn(num_reqs, (heads + 2 * kv_heads) * dim, device="cuda").bfloat16()
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=1)
    cache_fused = kv_cache.clone()
    fused = triton_paged_decode(
        q.view(num_reqs, heads, dim),
        k.view(num_reqs, kv_heads, dim),
        v.view(num_reqs, kv_heads, dim),
        cache_fused,
        tables,
        seq_lens,
        slots,
        None,
        plan=DecodePlan((32, 4), num_splits),
        rope=(positions, rope.cos_sin_cache),
    )
    q_rot, k_rot = rope(positions, q, k)
    reference = triton_paged_decode(
        q_rot.reshape(num_reqs, heads, dim),
        k_rot.reshape(num_reqs, kv_heads, dim),
        v.reshape(num_reqs, kv_heads, dim),
        kv_cache,
        tables,
        seq_lens,
        slots,
        None,
        plan=DecodePlan((32, 4), num_splits),
    )
    torch.testing.assert_close(
        cache_fused, kv_cache, rtol=2**-7, atol=2**-7
    )  # the rotated keys stored
    torch.testing.assert_close(fused.float(), reference.float(), rtol=2**-6, atol=2e-2)
