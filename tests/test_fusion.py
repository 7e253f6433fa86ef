"""The fusion pass (norm / SwiGLU folded into the next product) and the fused ops.

CPU-OK: the pass on a compiled tiny model (same tokens as eager, three pairs a layer,
nothing fused that has a second reader) and the fused ops' portable implementations.
GPU-REQ: the Triton GEMV prologues against the unfused arithmetic, and a compiled
engine with the pass against the same engine without it.
"""

from __future__ import annotations

import operator
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.fx
import torch.nn.functional as F

from mini_vllm.compilation.passes.fusion import fuse_norm_and_act_into_linear, op_name
from mini_vllm.layers.activation import silu_and_mul_native
from mini_vllm.layers.layernorm import rms_norm_native

sys.path.insert(0, str(Path(__file__).parent))
from test_compile import GREEDY, make, prompts


def mini_vllm_ops(graph: torch.fx.Graph) -> Counter:
    return Counter(
        name for name in map(op_name, graph.nodes) if name and name.startswith("mini_vllm::")
    )


@pytest.fixture(scope="module")
def fused_cpu_llm():
    llm = make(
        "cpu",
        compilation_mode="vllm_compile",
        cudagraph_mode="full_and_piecewise",
        enable_fusion=True,
    )
    return llm, [o.token_ids for o in llm.generate(prompts(), GREEDY, use_tqdm=False)]


def test_fused_compile_generates_what_eager_generates(fused_cpu_llm):
    llm, tokens = fused_cpu_llm
    assert tokens == [o.token_ids for o in make("cpu").generate(prompts(), GREEDY, use_tqdm=False)]
    layers = llm.engine.model.config.num_hidden_layers
    assert f"{4 * layers} op pair(s) fused" in llm.engine.runner.compile_report.line()


def test_four_pairs_a_layer_are_fused(fused_cpu_llm):
    llm, _ = fused_cpu_llm
    layers = llm.engine.model.config.num_hidden_layers
    stats = llm.engine.runner.graphs.compile_stats
    assert stats.fused_pairs == 4 * layers
    ops = mini_vllm_ops(stats.graph.graph)
    assert ops["mini_vllm::rms_norm_linear"] == 1  # layer 0's input norm has no residual yet
    assert ops["mini_vllm::fused_add_rms_norm_linear"] == 2 * layers - 1
    assert ops["mini_vllm::silu_and_mul_linear"] == layers
    # Left: o_proj (after attention, an opaque op) and the final norm (the LM head is
    # outside the compiled model); no activation is left unfused.
    assert ops["mini_vllm::linear"] == layers
    assert ops["mini_vllm::fused_add_rms_norm"] == 1
    assert ops["mini_vllm::rms_norm"] == 0 and ops["mini_vllm::silu_and_mul"] == 0
    # RoPE went into attention: no rotary op and no attention on rotated inputs is left.
    assert ops["mini_vllm::attention_with_rope"] == layers
    assert ops["mini_vllm::rotary_embedding"] == 0 and ops["mini_vllm::attention"] == 0
    # The split still cuts at every attention: layers + 1 compiled pieces.
    assert stats.compiled_pieces == layers + 1


def test_without_fusion_the_model_traces_plain_torch_ops():
    llm = make(
        "cpu", compilation_mode="vllm_compile", cudagraph_mode="none"
    )  # CPU default: no fusion
    llm.generate(prompts(1), GREEDY, use_tqdm=False)
    stats = llm.engine.runner.graphs.compile_stats
    assert stats.fused_pairs == 0
    assert set(mini_vllm_ops(stats.graph.graph)) == {"mini_vllm::attention"}


def test_rotary_op_is_the_layers_rotation():
    from mini_vllm.kernels.fused_ops import rotary_embedding_op
    from mini_vllm.layers.rotary_embedding import RotaryEmbedding

    rope = RotaryEmbedding(64, 256, 10000.0)
    positions = torch.tensor([0, 5, 77])
    q, k = torch.randn(3, 9 * 64), torch.randn(3, 3 * 64)
    for got, want in zip(
        rotary_embedding_op(positions, q, k, rope.cos_sin_cache), rope(positions, q, k)
    ):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def _norm_then_linear_graph(second_reader: bool) -> torch.fx.GraphModule:
    import mini_vllm.kernels  # noqa: F401  (registers the ops)

    graph = torch.fx.Graph()
    x, residual, g, w = (graph.placeholder(n) for n in ("x", "residual", "g", "w"))
    normed_and_sum = graph.call_function(
        torch.ops.mini_vllm.fused_add_rms_norm, (x, residual, g, 1e-6)
    )
    normed = graph.call_function(operator.getitem, (normed_and_sum, 0))
    summed = graph.call_function(operator.getitem, (normed_and_sum, 1))
    product = graph.call_function(torch.ops.mini_vllm.linear, (normed, w))
    out = graph.call_function(operator.add, (product, summed))
    if second_reader:
        out = graph.call_function(operator.mul, (out, normed))
    graph.output(out)
    return torch.fx.GraphModule(torch.nn.Module(), graph)


@pytest.mark.parametrize("second_reader", [False, True])
def test_pass_fuses_only_a_product_that_is_the_only_reader(second_reader):
    gm = _norm_then_linear_graph(second_reader)
    args = (torch.randn(1, 8), torch.randn(1, 8), torch.rand(8) + 0.5, torch.randn(8, 8))
    before = gm(*args)
    assert fuse_norm_and_act_into_linear(gm) == (0 if second_reader else 1)
    ops = mini_vllm_ops(gm.graph)
    if second_reader:
        assert ops == Counter({"mini_vllm::fused_add_rms_norm": 1, "mini_vllm::linear": 1})
    else:
        assert ops == Counter({"mini_vllm::fused_add_rms_norm_linear": 1})
    torch.testing.assert_close(gm(*args), before, rtol=0, atol=0)


def test_fused_ops_compute_the_unfused_pair_on_cpu():
    import mini_vllm.kernels  # noqa: F401

    torch.manual_seed(0)
    ops = torch.ops.mini_vllm
    x, residual, g = torch.randn(3, 16), torch.randn(3, 16), torch.rand(16) + 0.5
    w, w_down, gate_up = torch.randn(24, 16), torch.randn(16, 10), torch.randn(3, 20)
    exact = dict(rtol=0, atol=0)
    torch.testing.assert_close(
        ops.rms_norm_linear(x, g, 1e-6, w), F.linear(rms_norm_native(x, g, 1e-6), w), **exact
    )
    out, summed = ops.fused_add_rms_norm_linear(x, residual, g, 1e-6, w)
    torch.testing.assert_close(summed, x + residual, **exact)
    torch.testing.assert_close(out, F.linear(rms_norm_native(x + residual, g, 1e-6), w), **exact)
    torch.testing.assert_close(
        ops.silu_and_mul_linear(gate_up, w_down),
        F.linear(silu_and_mul_native(gate_up), w_down),
        **exact,
    )


# --- GPU-REQ -----------------------------------------------------------------------------

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


@pytest.mark.parametrize(
    "settings",
    [
        dict(),
        dict(compilation_mode="stock_torch_compile"),
        dict(compilation_mode="vllm_compile", enforce_eager=True),
    ],
)
def test_asking_for_fusion_without_vllm_compile_says_what_to_do(settings):
    from mini_vllm.engine.engine_config import EngineConfig

    with pytest.raises(
        ValueError, match="enable_fusion=True needs compilation_mode='vllm_compile'"
    ):
        EngineConfig(model="tiny", device="cpu", enable_fusion=True, **settings)
    EngineConfig(model="tiny", device="cpu", enable_fusion=False, **settings)  # off: always fine
