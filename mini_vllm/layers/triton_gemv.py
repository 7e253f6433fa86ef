"""One token's matrix product, `x @ W.T` for a single row, as a Triton kernel (CUDA only).

vLLM counterpart: none in the same form. vLLM leaves bf16 products to cuBLAS
(vllm/model_executor/layers/utils.py `default_unquantized_gemm`) and writes its own
kernels for the quantized ones (e.g. the GPTQ/AWQ GEMV kernels under csrc/quantization);
gpt-fast (generate.py) gets its batch-1 speed from Inductor and int8 weights. Here the
kernel exists because of a measurement: at batch 1 a decode step's products are
matrix-vector products, pure reads of the weight, and on the course's H100 cuBLAS's
bf16 kernels for them (`gemv2T_kernel_val`, `gemvx`) read the 1B model's matrices at
1.1-1.5 TB/s, a third to a half of what the memory can deliver.

The kernel is the textbook one: each program owns BLOCK_N rows of W, walks along K in
BLOCK_K-wide tiles (one coalesced load of a [BLOCK_N, BLOCK_K] tile of W and the
matching slice of x per step, accumulated in float32) and reduces at the end. W is
read exactly once and marked evict-first: nothing will read it again this step. The
tile shape is autotuned per matrix shape, at the first call, which the engine makes
in its warm-up runs before any CUDA graph is captured.

Only one-row products take it (`dispatch_linear`); from two rows on, a GEMM reuses
each weight tile across rows, which a GEMV cannot. Under torch.compile the choice is
made at run time inside the opaque op `mini_vllm::linear`, because one compiled graph
serves every token count.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU machines
    triton = None

__all__ = ["triton_gemv", "triton_gemv_available"]


def triton_gemv_available(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (triton is not None and x.is_cuda and x.dim() == 2 and weight.dim() == 2
            and x.stride(-1) == 1 and weight.stride(-1) == 1 and x.dtype == weight.dtype)


if triton is not None:

    def _configs():
        shapes = [(4, 256, 4), (8, 256, 4), (16, 256, 4), (32, 256, 8), (8, 512, 4), (16, 512, 8),
                  (4, 512, 4), (2, 1024, 4), (16, 128, 4), (32, 128, 4), (64, 128, 8)]
        return [triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w) for n, k, w in shapes]

    # Keep the tuning results on disk (Triton's cache) where this Triton can: tuning all
    # configurations for the first time costs seconds at engine start-up.
    _cache_tuning = {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}

    # ANCHOR: gemv_kernel
    @triton.autotune(configs=_configs(), key=["N", "K"], **_cache_tuning)
    @triton.jit
    def _gemv_kernel(x_ptr, w_ptr, out_ptr, N, K, stride_wn,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_mask = rows < N
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            col_mask = cols < K
            x = tl.load(x_ptr + cols, mask=col_mask, other=0.0)
            w = tl.load(w_ptr + rows[:, None] * stride_wn + cols[None, :],
                        mask=row_mask[:, None] & col_mask[None, :], other=0.0, eviction_policy="evict_first")
            acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        out = tl.sum(acc, axis=1)
        tl.store(out_ptr + rows, out.to(out_ptr.dtype.element_ty), mask=row_mask)
    # ANCHOR_END: gemv_kernel


def triton_gemv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`F.linear(x, weight)` for x `[1, K]` and a row-major weight `[N, K]`."""
    n, k = weight.shape
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    _gemv_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](x, weight, out, n, k, weight.stride(0))
    return out


# ANCHOR: linear_op
@torch.library.custom_op("mini_vllm::linear", mutates_args=())
def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`F.linear` whose one-row case takes the Triton GEMV; chosen when it runs, not traced."""
    if x.shape[0] == 1 and triton_gemv_available(x, weight):
        return triton_gemv(x, weight)
    return F.linear(x, weight)


@linear.register_fake
def _linear_fake(x, weight):
    return x.new_empty((x.shape[0], weight.shape[0]))
# ANCHOR_END: linear_op
