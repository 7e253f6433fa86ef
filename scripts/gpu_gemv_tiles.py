"""Which tile the GEMV's autotuner picks for each matrix of SmolLM2 and Llama-3.2-1B (H100)."""
import torch

from mini_vllm.layers import triton_gemv as gemv

SHAPES = {"smollm2-135m": [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)],
          "llama-3.2-1b": [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (128256, 2048)]}
for model, shapes in SHAPES.items():
    for n, k in shapes:
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        gemv.triton_gemv(x, w)
        config = gemv._gemv_kernel.best_config
        print(f"{model} {n:6d} x {k:5d}: BLOCK_N {config.kwargs['BLOCK_N']:3d}, BLOCK_K {config.kwargs['BLOCK_K']:4d}, "
              f"{config.num_warps} warps")
