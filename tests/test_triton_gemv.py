"""The Triton GEMV (one-row products on CUDA) equals F.linear (GPU-REQ).

Tolerance: both accumulate in float32 and round once to bfloat16; only the order of
the sum differs, which can move a result by one bfloat16 step (2^-8 relative) at a
rounding boundary. Checked against a float32 product for a fair reference.
"""

from __future__ import annotations

import pytest
import torch

from mini_vllm.layers.linear import ReplicatedLinear

pytestmark = pytest.mark.gpu

# SmolLM2 and Llama-3.2-1B shapes (out, in), an LM head, and sizes off every tile.
SHAPES = [
    (960, 576),
    (576, 576),
    (3072, 576),
    (576, 1536),
    (3072, 2048),
    (16384, 2048),
    (2048, 8192),
    (49152, 576),
    (1000, 333),
    (7, 100),
]


@pytest.mark.parametrize("out_features, in_features", SHAPES)
def test_gemv_matches_a_float32_product(out_features, in_features):
    from mini_vllm.layers.triton_gemv import triton_gemv

    gen = torch.Generator(device="cuda").manual_seed(out_features)
    x = torch.randn(1, in_features, device="cuda", generator=gen).bfloat16()
    w = (
        torch.randn(out_features, in_features, device="cuda", generator=gen) / in_features**0.5
    ).bfloat16()
    expected = x.float() @ w.float().t()
    got = triton_gemv(x, w)
    assert got.shape == (1, out_features) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, rtol=2**-7, atol=1e-3)
    # A linear layer takes it for one row, and F.linear (cuBLAS) for more.
    layer = _layer(w)
    torch.testing.assert_close(layer(x).float(), got.float(), rtol=0, atol=0)
    x4 = x.repeat(4, 1)
    torch.testing.assert_close(layer(x4).float(), expected.repeat(4, 1), rtol=2**-7, atol=1e-3)


def _layer(weight: torch.Tensor) -> ReplicatedLinear:
    with torch.device(weight.device):
        layer = ReplicatedLinear(weight.shape[1], weight.shape[0]).to(weight.dtype)
    layer.weight.data.copy_(weight)
    return layer


def test_linear_op_under_torch_compile_picks_at_run_time():
    layer = _layer(torch.randn(3072, 576, device="cuda").bfloat16())

    def f(x):
        return layer(x) * 2

    compiled = torch.compile(f, dynamic=True, fullgraph=True)
    for rows in (1, 2, 5):
        x = torch.randn(rows, 576, device="cuda").bfloat16()
        torch.testing.assert_close(compiled(x).float(), f(x).float(), rtol=2**-7, atol=1e-2)


def test_second_launch_reuses_the_compiled_kernel_and_respects_alignment():
    """After the first (autotuned) launch the compiled kernel is launched directly; a
    misaligned view of the same shape gets a kernel of its own, and both stay exact."""
    from mini_vllm.layers import triton_gemv as gemv

    gen = torch.Generator(device="cuda").manual_seed(5)
    w = (torch.randn(1000, 333, device="cuda", generator=gen) / 333**0.5).bfloat16()
    buffer = torch.randn(1, 334 + 8, device="cuda", generator=gen).bfloat16()
    aligned, misaligned = buffer[:, :333], buffer[:, 1:334]  # the second starts 2 bytes in
    assert aligned.data_ptr() % 16 == 0 and misaligned.data_ptr() % 16 != 0
    gemv._compiled_launches.clear()
    for x in (aligned, misaligned):
        expected = x.float() @ w.float().t()
        first = gemv.triton_gemv(x, w)
        kept = len(gemv._compiled_launches)
        second = gemv.triton_gemv(x, w)  # through the kept kernel
        assert len(gemv._compiled_launches) == kept
        torch.testing.assert_close(second, first, rtol=0, atol=0)
        torch.testing.assert_close(second.float(), expected, rtol=2**-7, atol=1e-3)
    assert len(gemv._compiled_launches) == 2  # one kernel per alignment
