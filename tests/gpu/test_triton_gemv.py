"""The Triton GEMV and skinny GEMM (products of 1 to 64 rows on CUDA) equal F.linear (GPU-REQ).

Tolerance: both accumulate in float32 and round once to bfloat16; only the order of
the sum differs, which can move a result by one bfloat16 step (2^-8 relative) at a
rounding boundary. Checked against a float32 product for a fair reference.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

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


@pytest.mark.parametrize("rows", [1, 8, 33])  # the GEMV, the 16- and 64-row buckets
@pytest.mark.parametrize("out_features, in_features", SHAPES)
def test_gemv_matches_a_float32_product(out_features, in_features, rows):
    from mini_vllm.kernels.gemv import triton_gemv

    gen = torch.Generator(device="cuda").manual_seed(out_features)
    x = torch.randn(rows, in_features, device="cuda", generator=gen).bfloat16()
    w = (
        torch.randn(out_features, in_features, device="cuda", generator=gen) / in_features**0.5
    ).bfloat16()
    expected = x.float() @ w.float().t()
    got = triton_gemv(x, w)
    assert got.shape == (rows, out_features) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, rtol=2**-7, atol=1e-3)
    # A linear layer takes it for one row; for more, it or cuBLAS, whichever measured faster.
    layer = _layer(w)
    if rows == 1:
        torch.testing.assert_close(layer(x).float(), got.float(), rtol=0, atol=0)
    else:
        torch.testing.assert_close(layer(x).float(), expected, rtol=2**-7, atol=1e-3)


def test_more_rows_or_float32_take_cublas():
    """From 65 rows on, and for more than one float32 row, the layer is F.linear itself."""
    w = torch.randn(3072, 576, device="cuda")
    for dtype, rows in ((torch.bfloat16, 65), (torch.bfloat16, 128), (torch.float32, 8)):
        layer = _layer(w.to(dtype))
        x = torch.randn(rows, 576, device="cuda").to(dtype)
        torch.testing.assert_close(layer(x), F.linear(x, w.to(dtype)), rtol=0, atol=0)


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
    for rows in (1, 2, 5, 64, 65):
        x = torch.randn(rows, 576, device="cuda").bfloat16()
        torch.testing.assert_close(compiled(x).float(), f(x).float(), rtol=2**-7, atol=1e-2)


def test_second_launch_reuses_the_compiled_kernel_and_respects_alignment():
    """After the first (autotuned) launch the compiled kernel is launched directly; a
    misaligned view of the same shape gets a kernel of its own, and both stay exact."""
    from mini_vllm.kernels import gemv

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


def test_skinny_kernels_are_kept_per_row_bucket_and_serve_strided_rows():
    """17 and 31 rows share one kept kernel (the same 32-row bucket, neither divisible by
    16); 32 rows get their own; rows that are a view with a longer stride are exact too."""
    from mini_vllm.kernels import gemv

    gen = torch.Generator(device="cuda").manual_seed(7)
    w = (torch.randn(1000, 333, device="cuda", generator=gen) / 333**0.5).bfloat16()
    buffer = torch.randn(32, 400, device="cuda", generator=gen).bfloat16()
    gemv._compiled_launches.clear()
    for rows in (17, 31, 32):
        x = buffer[:rows, :333]  # row stride 400
        expected = x.float() @ w.float().t()
        first = gemv.triton_gemv(x, w)
        second = gemv.triton_gemv(x, w)
        torch.testing.assert_close(second, first, rtol=0, atol=0)
        torch.testing.assert_close(second.float(), expected, rtol=2**-7, atol=1e-3)
    assert len(gemv._compiled_launches) == 2


def test_the_skinny_choice_is_measured_once_and_never_inside_a_capture():
    from mini_vllm.kernels import gemv

    w = torch.randn(960, 576, device="cuda").bfloat16()
    x = torch.randn(8, 576, device="cuda").bfloat16()
    gemv._skinny_choices.clear()
    calls = []

    def counted(fn):
        return lambda: (calls.append(fn), fn())[1]

    skinny, cublas = counted(lambda: gemv.triton_gemv(x, w)), counted(lambda: F.linear(x, w))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # inside a capture: the fallback, and nothing measured
        assert gemv.skinny_is_faster(x, w, gemv.PLAIN, skinny, cublas) is False
    assert not calls and not gemv._skinny_choices
    first = gemv.skinny_is_faster(x, w, gemv.PLAIN, skinny, cublas)
    measured = len(calls)
    assert measured > 0 and len(gemv._skinny_choices) == 1
    x12 = torch.randn(12, 576, device="cuda").bfloat16()  # the same 16-row bucket
    assert gemv.skinny_is_faster(x12, w, gemv.PLAIN, skinny, cublas) is first
    assert len(calls) == measured  # kept, not measured again


def test_the_autotuner_times_each_tile_in_a_graph_without_collecting_garbage(monkeypatch, tmp_path):
    import gc

    from mini_vllm.kernels import gemv

    timed = []
    real = gemv.tile_time_ms

    def counted(kernel_call, quantiles=(0.5,), **kw):
        timed.append(quantiles)
        return real(kernel_call, quantiles, **kw)

    monkeypatch.setattr(gemv, "tile_time_ms", counted)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # no pick from an earlier run
    monkeypatch.setattr(gc, "collect", lambda *a, **k: pytest.fail("gc.collect in tile timing"))
    w = torch.randn(200, 96, device="cuda").bfloat16()  # a shape no other test tunes
    x = torch.randn(1, 96, device="cuda").bfloat16()
    out = gemv.triton_gemv(x, w)
    torch.testing.assert_close(out.float(), F.linear(x.float(), w.float()), rtol=2**-7, atol=1e-3)
    # Every tile that compiles is timed once, with Triton's three quantiles.
    assert len(timed) >= 8 and all(q == (0.5, 0.2, 0.8) for q in timed)

    import sys
    from pathlib import Path

    # The picks by (N, K, prologue) come from the GPU scripts' kit, which lives beside the
    # scripts (scripts/gpu/gpukit.py), not in the package.
    kit = str(Path(__file__).resolve().parents[2] / "scripts" / "gpu")
    if kit not in sys.path:
        sys.path.insert(0, kit)
    import gpukit

    assert (200, 96, gemv.PLAIN) in gpukit.gemv_tile_picks()


def test_tile_time_is_per_call_and_ordered_by_quantile():
    from mini_vllm.kernels import gemv

    x = torch.randn(4096, device="cuda")
    median, low, high = gemv.tile_time_ms(lambda: x.mul_(1.0), (0.5, 0.2, 0.8))
    assert 0 < low <= median <= high < 1.0  # ms for one small elementwise kernel


@pytest.mark.parametrize("tile", [(16, 128, 4, 3), (32, 1024, 8, 1)])  # K in steps, a whole row
def test_a_given_skinny_tile_computes_each_prologue_as_the_unfused_ops(tile):
    """`skinny_gemm_with_tile`, what the tile sweep runs, bypasses the autotuner but not
    the kernel's contract: plain, RMSNorm after a residual add (the new residual written
    too), and SiLU-and-multiply all equal the ops they fold, for a tile whose BLOCK_K
    walks K in steps and one that holds the whole row."""
    import sys
    from pathlib import Path

    from mini_vllm.kernels import gemv
    from mini_vllm.layers.activation import silu_and_mul_native
    from mini_vllm.layers.layernorm import rms_norm_native

    # The sweep's launcher lives in the GPU scripts' kit (scripts/gpu/gpukit.py), beside the
    # scripts, not in the package.
    kit = str(Path(__file__).resolve().parents[2] / "scripts" / "gpu")
    if kit not in sys.path:
        sys.path.insert(0, kit)
    import gpukit

    gen = torch.Generator(device="cuda").manual_seed(11)
    rows, n, k = 8, 960, 576
    w = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).bfloat16()
    x = torch.randn(rows, k, device="cuda", generator=gen).bfloat16()
    residual = torch.randn(rows, k, device="cuda", generator=gen).bfloat16()
    norm_weight = (torch.rand(k, device="cuda", generator=gen) + 0.5).bfloat16()
    gate_up = torch.randn(rows, 2 * k, device="cuda", generator=gen).bfloat16()
    out = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
    residual_out = torch.empty_like(x)

    gpukit.skinny_gemm_with_tile(x, w, out, gemv.PLAIN, tile)
    torch.testing.assert_close(out.float(), x.float() @ w.float().t(), rtol=2**-7, atol=1e-3)

    gpukit.skinny_gemm_with_tile(
        x, w, out, gemv.ADD_RMS_NORM, tile, residual, norm_weight, residual_out, 1e-5
    )
    summed = x + residual
    torch.testing.assert_close(residual_out, summed, rtol=0, atol=0)
    normed = rms_norm_native(summed, norm_weight, 1e-5)
    torch.testing.assert_close(out.float(), F.linear(normed, w).float(), rtol=2e-2, atol=2e-2)

    gpukit.skinny_gemm_with_tile(gate_up, w, out, gemv.SILU_AND_MUL, tile)
    expected = F.linear(silu_and_mul_native(gate_up), w)
    torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=2e-2)
