#!/usr/bin/env python3
"""The skinny GEMM's tiles, one by one, for each product of a decode layer and its prologue.

    python3 scripts/gpu/skinny_tiles.py [--out DIR] [--rows 8,32] [--models smollm2-135m]
                                        [--products qkv,o_proj,gate_up,down]

For every product of one Llama layer (qkv after the first RMSNorm, o_proj plain, gate_up
after the residual add and RMSNorm, down after SiLU-and-multiply), bf16: the time of one
call inside a CUDA graph (20 calls a graph, programmatic dependent launch as in the
engine) of `skinny_gemm_kernel` (mini_vllm/kernels/gemv.py) with each tile (BLOCK_N,
BLOCK_K, warps, stages) forced (gpukit's `skinny_gemm_with_tile`), against what the engine
runs without the fusion (the norm or activation kernel, then cuBLAS) and against the tile
the autotuner picks. A BLOCK_K of at least K makes the prologue run once a program
instead of once per step of K. Each product and row count
compiles and times 60 tiles, a minute or more (the down product, K = 1536, longest);
the tile being timed is shown as it goes.
"""

from __future__ import annotations

import itertools
import sys

from gpukit import product_time_us, run_script, skinny_gemm_with_tile

# (name, N, K, prologue name) per layer, in the order a layer runs them.
LAYERS = {
    "smollm2-135m": [("qkv", 960, 576, "add_rms_norm"), ("o_proj", 576, 576, "plain"),
                     ("gate_up", 3072, 576, "add_rms_norm"), ("down", 576, 1536, "silu_and_mul")],
    "llama-3.2-1b": [("qkv", 3072, 2048, "add_rms_norm"), ("o_proj", 2048, 2048, "plain"),
                     ("gate_up", 16384, 2048, "add_rms_norm"),
                     ("down", 2048, 8192, "silu_and_mul")],
}  # fmt: skip


def add_arguments(parser) -> None:
    parser.add_argument("--rows", default="8,32", help="row counts (default: %(default)s)")
    parser.add_argument(
        "--models", default="smollm2-135m", help="model shapes (default: %(default)s)"
    )
    parser.add_argument(
        "--products",
        default="qkv,o_proj,gate_up,down",
        help="products of a layer to sweep (default: %(default)s)",
    )
    parser.add_argument("--top", type=int, default=3, help="best tiles shown (default: 3)")


def tiles(k: int):
    """(BLOCK_N, BLOCK_K, warps, stages) to try: K in steps, and whole rows."""
    whole = 1 << (k - 1).bit_length()
    blocks_k = sorted({128, 256, 512, min(whole, 2048)})
    for block_n, block_k, warps in itertools.product((16, 32, 64), blocks_k, (4, 8)):
        for stages in (1, 2, 3) if block_k < k else (1,):
            yield block_n, block_k, warps, stages


def measure(args, report) -> None:
    import torch

    from mini_vllm.kernels import gemv

    report(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; "
           f"PDL {gemv.pdl_supported(torch.device('cuda'))}")  # fmt: skip
    report("us per call in a graph; tile = (BLOCK_N, BLOCK_K, warps, stages)")
    report(
        "| model | product | out x in | prologue | rows | unfused us | autotuned us "
        "| best tile | best us | next tiles |"
    )
    report("|---|---|---|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        for name, n, k, prologue in LAYERS[model]:
            if name not in args.products.split(","):
                continue
            for rows in (int(r) for r in args.rows.split(",")):
                unfused, autotuned, results = sweep_product(n, k, prologue, rows)
                best_us, best = results[0]
                following = ", ".join(f"{t} {us:.1f}" for us, t in results[1 : args.top])
                report(
                    f"| {model} | {name} | {n} x {k} | {prologue} | {rows} | {unfused:.1f} "
                    f"| {autotuned:.1f} | {best} | {best_us:.1f} | {following} |"
                )
            torch.cuda.empty_cache()


def sweep_product(n: int, k: int, prologue: str, rows: int):
    """(us of the unfused pair, us of the autotuned skinny kernel, [(us, tile)] best first)."""
    import torch
    import torch.nn.functional as F

    from mini_vllm.kernels import gemv
    from mini_vllm.kernels.activation import silu_and_mul
    from mini_vllm.kernels.fused_ops import fused_add_rms_norm_linear, silu_and_mul_linear
    from mini_vllm.kernels.rms_norm import rms_norm_cuda

    eps = 1e-5
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    norm_weight = torch.rand(k, device="cuda", dtype=torch.bfloat16) + 0.5
    x = torch.randn(rows, 2 * k if prologue == "silu_and_mul" else k, device="cuda",
                    dtype=torch.bfloat16)  # fmt: skip
    residual = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    residual_out = torch.empty_like(residual)
    out = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
    if prologue == "plain":
        code = gemv.PLAIN
        unfused = lambda: F.linear(x, weight)  # noqa: E731
        autotuned = lambda: gemv.triton_gemv(x, weight)  # noqa: E731
        engine = autotuned
    elif prologue == "add_rms_norm":
        code = gemv.ADD_RMS_NORM
        unfused = lambda: F.linear(  # noqa: E731
            rms_norm_cuda(x, norm_weight, eps, residual)[0], weight
        )
        autotuned = lambda: gemv.triton_rms_norm_gemv(  # noqa: E731
            x, residual, norm_weight, eps, weight
        )
        engine = lambda: fused_add_rms_norm_linear(  # noqa: E731
            x, residual, norm_weight, eps, weight
        )[0]
    else:
        code = gemv.SILU_AND_MUL
        unfused = lambda: F.linear(silu_and_mul(x), weight)  # noqa: E731
        autotuned = lambda: gemv.triton_silu_and_mul_gemv(x, weight)  # noqa: E731
        engine = lambda: silu_and_mul_linear(x, weight)  # noqa: E731
    expected = unfused()
    # The op as the engine calls it (whichever kernel it chooses) agrees with the pair.
    torch.testing.assert_close(engine(), expected, atol=0.05, rtol=0.05)

    results = []
    candidates = list(tiles(k))
    for number, tile in enumerate(candidates, 1):
        print(f"  {n} x {k}, {rows} rows: tile {number} of {len(candidates)}", end="\r",
              file=sys.stderr, flush=True)  # fmt: skip

        def call(tile=tile):
            skinny_gemm_with_tile(
                x, weight, out, code, tile, residual, norm_weight, residual_out, eps
            )

        try:
            call()
        except Exception as error:  # e.g. a tile too large for an SM's shared memory
            print(f"  {n} x {k} rows {rows} tile {tile}: {type(error).__name__}", flush=True)
            continue
        torch.testing.assert_close(out, expected, atol=0.05, rtol=0.05)
        results.append((product_time_us(call), tile))
    return product_time_us(unfused), product_time_us(autotuned), sorted(results)


if __name__ == "__main__":
    sys.exit(run_script(__file__, __doc__.splitlines()[0], measure, add_arguments))
