#!/usr/bin/env python3
"""Which tile the GEMV's autotuner picks for each matrix of SmolLM2 and Llama-3.2-1B.

    python3 scripts/gpu/gemv_tiles.py [--out DIR]

One line a matrix (out x in): BLOCK_N rows a program, BLOCK_K columns a tile, warps.
Whole-row tiles (BLOCK_K >= K) are what lets a program request all its weights before the
wait of programmatic dependent launch. A pick is read from Triton's cache if an earlier
run made one; scripts/gpu/tile_timing.py starts from empty caches to see how steady the
picks are.
"""

from __future__ import annotations

import sys

from gpukit import autotuned_tile, run_script

SHAPES = {
    "smollm2-135m": [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)],
    "llama-3.2-1b": [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (128256, 2048)],
}


def measure(args, report) -> None:
    import torch

    for model, shapes in SHAPES.items():
        for n, k in shapes:
            x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            tile = autotuned_tile(x, weight)
            report(
                f"{model} {n:6d} x {k:5d}: BLOCK_N {tile['BLOCK_N']:3d}, "
                f"BLOCK_K {tile['BLOCK_K']:4d}, {tile['num_warps']} warps"
            )


if __name__ == "__main__":
    sys.exit(run_script(__file__, __doc__.splitlines()[0], measure))
