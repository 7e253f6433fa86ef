"""RMSNorm with the residual add, as one Triton kernel (CUDA only).

vLLM counterpart: the `fused_add_rms_norm` / `rms_norm` CUDA kernels of
csrc/layernorm_kernels.cu, which `RMSNorm.forward_cuda` in
vllm/model_executor/layers/layernorm.py calls; `forward_native` is the plain torch
version. Under torch.compile vLLM prefers the native version by default so that Inductor
can fuse it with its neighbours; mini_vllm does the same (mini_vllm/layers/custom_op.py).

Why: written in torch, "add, cast, square, mean, add eps, rsqrt, multiply, cast,
multiply by the weight" is about nine kernels, twice a layer. In a FULL CUDA graph the
launch costs are gone, but each of those kernels still costs a microsecond or two of
GPU time for a few kilobytes of work; at 30 layers that is more than half of a
SmolLM2 decode step's kernels. Here it is one kernel: one program reads a row (and
its residual), and writes the normalised row (and the new residual).

The arithmetic matches the torch version: the add rounds to the activation dtype, the
statistics are in float32, the normalised row is rounded to the activation dtype before
the weight multiplies it. Only the order of the float32 sum differs.
"""

from __future__ import annotations

import torch

from mini_vllm.kernels.launch import launch, next_power_of_2
from mini_vllm.layers.layernorm import rms_norm_native

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU machines: the torch version is used
    triton = None

__all__ = ["rms_norm_cuda", "triton_rmsnorm", "triton_rmsnorm_fits"]


def triton_rmsnorm_fits(
    x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None = None
) -> bool:
    """Rows of CUDA activations in the weight's dtype, each row (and residual row) contiguous."""
    return (
        triton is not None
        and x.is_cuda
        and x.dim() == 2
        and x.stride(-1) == 1
        and x.dtype == weight.dtype
        and (residual is None or residual.stride(-1) == 1)
    )


if triton is not None:
    # ANCHOR: rmsnorm_kernel
    @triton.jit
    def _rmsnorm_kernel(
        x_ptr,
        residual_ptr,
        weight_ptr,
        out_ptr,
        residual_out_ptr,
        stride_x,
        stride_r,
        hidden,
        eps,
        HAS_RESIDUAL: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        offsets = tl.arange(0, BLOCK)
        mask = offsets < hidden
        x = tl.load(x_ptr + row * stride_x + offsets, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            residual = tl.load(residual_ptr + row * stride_r + offsets, mask=mask, other=0.0)
            x = (x.to(tl.float32) + residual.to(tl.float32)).to(x.dtype)
            tl.store(residual_out_ptr + row * hidden + offsets, x, mask=mask)
        xf = x.to(tl.float32)
        variance = tl.sum(xf * xf, axis=0) / hidden
        normed = (xf * tl.rsqrt(variance + eps)).to(x.dtype)
        weight = tl.load(weight_ptr + offsets, mask=mask, other=0.0)
        out = (normed.to(tl.float32) * weight.to(tl.float32)).to(x.dtype)
        tl.store(out_ptr + row * hidden + offsets, out, mask=mask)

    # ANCHOR_END: rmsnorm_kernel


def triton_rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
):
    """`RMSNorm.forward` on [tokens, hidden] CUDA tensors, in one kernel launch."""
    tokens, hidden = x.shape
    out = torch.empty((tokens, hidden), dtype=x.dtype, device=x.device)
    residual_out = torch.empty_like(out) if residual is not None else out
    if tokens:
        launch(
            _rmsnorm_kernel,
            (tokens,),
            x,
            residual if residual is not None else x,
            weight,
            out,
            residual_out,
            x.stride(0),
            residual.stride(0) if residual is not None else 0,
            hidden,
            eps,
            residual is not None,  # HAS_RESIDUAL
            next_power_of_2(hidden),  # BLOCK
            num_warps=4,
        )
    return out if residual is None else (out, residual_out)


def rms_norm_cuda(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
):
    """RMSNorm (with the residual add): the kernel where it fits, the native version elsewhere."""
    if triton_rmsnorm_fits(x, weight, residual):
        return triton_rmsnorm(x, weight, eps, residual)
    if residual is None:
        return rms_norm_native(x, weight, eps)
    summed = x + residual
    return rms_norm_native(summed, weight, eps), summed
