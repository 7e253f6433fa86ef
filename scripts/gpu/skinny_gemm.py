#!/usr/bin/env python3
"""The decode products at 1 to 64 rows: mini_vllm's Triton kernels against cuBLAS, per matrix.

    python3 scripts/gpu/skinny_gemm.py [--out DIR] [--rows 1,8,16,32,64] [--models smollm2-135m]

For every matrix of SmolLM2-135M, Llama-3.2-1B and Llama-3.1-8B (bf16): the time of one
product inside a CUDA graph (20 products a graph, so that no host launch is counted), for
the Triton kernel (`triton_gemv`: the GEMV at one row, the skinny GEMM from two) and for
`F.linear` (cuBLAS); and the same for the pairs the fusion pass folds, RMSNorm then the
product (two kernels: Triton's norm and cuBLAS) against the one fused kernel. GB/s is the
weight's bytes over the time: the copy bandwidth of an H100 is about 2.9 TB/s.
"""

from __future__ import annotations

import sys

from gpukit import product_time_us, run_script

SHAPES = {
    "smollm2-135m": [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)],
    "llama-3.2-1b": [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (128256, 2048)],
    "llama-3.1-8b": [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)],
}


def add_arguments(parser) -> None:
    parser.add_argument("--rows", default="1,8,16,32,64", help="row counts (default: %(default)s)")
    parser.add_argument(
        "--models", default=",".join(SHAPES), help="model shapes (default: %(default)s)"
    )


def measure(args, report) -> None:
    import torch
    import torch.nn.functional as F

    from mini_vllm.kernels.gemv import triton_gemv, triton_rms_norm_gemv
    from mini_vllm.kernels.rms_norm import triton_rmsnorm

    rows_list = [int(r) for r in args.rows.split(",")]
    models = args.models.split(",")
    unknown = [model for model in models if model not in SHAPES]
    if unknown:
        raise SystemExit(f"unknown --models {unknown}: choose among {', '.join(SHAPES)}")
    report(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; us per product in a graph")
    report(
        "| model | out x in | rows | triton us | cublas us | triton GB/s | cublas GB/s "
        "| norm+cublas us | fused us |"
    )
    report("|---|---|---|---|---|---|---|---|---|")
    for model in models:
        shapes = SHAPES[model]
        for n, k in shapes:
            weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
            norm_weight = torch.rand(k, device="cuda", dtype=torch.bfloat16) + 0.5
            gigabytes = weight.numel() * weight.element_size() / 1e9
            for rows in rows_list:
                x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
                ours = product_time_us(lambda x=x, w=weight: triton_gemv(x, w))
                cublas = product_time_us(lambda x=x, w=weight: F.linear(x, w))
                unfused = product_time_us(
                    lambda x=x, w=weight, g=norm_weight: F.linear(triton_rmsnorm(x, g, 1e-5), w)
                )
                fused = product_time_us(
                    lambda x=x, w=weight, g=norm_weight: triton_rms_norm_gemv(x, None, g, 1e-5, w)
                )
                report(
                    f"| {model} | {n} x {k} | {rows} | {ours:.1f} | {cublas:.1f} "
                    f"| {gigabytes / ours * 1e6:.0f} | {gigabytes / cublas * 1e6:.0f} "
                    f"| {unfused:.1f} | {fused:.1f} |"
                )
            del weight
            torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(run_script(__file__, __doc__.splitlines()[0], measure, add_arguments))
