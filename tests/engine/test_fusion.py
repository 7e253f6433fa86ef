"""The fusion pass (norm / SwiGLU folded into the next product) and the fused ops.

CPU-OK: the pass on a compiled tiny model (same tokens as eager, three pairs a layer,
nothing fused that has a second reader) and the fused ops' portable implementations.
Their GPU side (the Triton GEMV prologues against the unfused arithmetic, and a compiled
engine with the pass against the same engine without it): tests/gpu/test_fusion_cuda.py.
"""

from __future__ import annotations

import operator
from collections import Counter

import pytest
import torch
import torch.fx
import torch.nn.functional as F

from mini_vllm.compilation.passes.fusion import fuse_norm_and_act_into_linear, op_name
from mini_vllm.layers.activation import silu_and_mul_native
from mini_vllm.layers.layernorm import rms_norm_native
from tests.engine.test_compile import GREEDY, make, prompts


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
