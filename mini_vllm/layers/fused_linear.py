"""A norm or an activation and the matrix product after it, as one op: what the fusion pass emits.

vLLM counterpart: the fused kernels its compile-time fusion passes put in place of a
pair of ops, e.g. `torch.ops._C.fused_add_rms_norm_static_fp8_quant` for RMSNorm then
FP8 quantisation (vllm/compilation/fusion.py, `RMSNormQuantFusionPass`) and
`torch.ops._C.silu_and_mul_quant` for SiluAndMul then quantisation
(vllm/compilation/activation_quant_fusion.py). vLLM fuses into the quantisation that
feeds a GEMM; mini_vllm has no quantisation and fuses into the product itself.

Why: at batch 1 on a GPU a decode step is a chain of tiny kernels, and in a CUDA graph
each still costs its few microseconds. An RMSNorm reads one row of a few hundred values;
the GEMV after it reads that row too. Done inside the GEMV (a prologue, see
mini_vllm/layers/triton_gemv.py), the norm costs no kernel of its own; same for
SwiGLU's `silu(gate) * up` before the down projection. Three kernels fewer per layer.

The fused kernels exist only for decode-sized batches on CUDA (one row, or up to
64 rows in half precision: mini_vllm/layers/triton_gemv.py); every other case runs the two ops one
after the other, so each op is correct on every device and token count (the compiled
graph serves them all). Outputs never alias inputs, as custom ops require.
"""

from __future__ import annotations

import torch

from mini_vllm.layers.activation import silu_and_mul_cuda
from mini_vllm.layers.layernorm import fused_add_rms_norm_op, rms_norm_op
from mini_vllm.layers.triton_gemv import (
    ADD_RMS_NORM,
    RMS_NORM,
    SILU_AND_MUL,
    linear_cuda,
    skinny_is_faster,
    triton_gemv_available,
    triton_rms_norm_gemv,
    triton_silu_and_mul_gemv,
)
from mini_vllm.torch_utils import direct_register_custom_op

__all__ = ["fused_add_rms_norm_linear", "rms_norm_linear", "silu_and_mul_linear"]


def _fused_kernel_fits(
    x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor | None = None
) -> bool:
    return (
        triton_gemv_available(x, weight)
        and x.is_contiguous()
        and (norm_weight is None or norm_weight.dtype == x.dtype)
    )


def _fused_wins(x, weight, prologue: int, fused, unfused) -> bool:
    """One row: the fused GEMV always (measured). More: where the fused skinny kernel
    measured faster than the two ops (mini_vllm/layers/triton_gemv.py `skinny_is_faster`)."""
    return x.shape[0] == 1 or skinny_is_faster(x, weight, prologue, fused, unfused)


# ANCHOR: fused_ops
def rms_norm_linear(
    x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor
) -> torch.Tensor:
    """linear(RMSNorm(x), weight)."""

    def fused():
        return triton_rms_norm_gemv(x, None, norm_weight, eps, weight)

    def unfused():
        return linear_cuda(rms_norm_op(x, norm_weight, eps), weight)

    if _fused_kernel_fits(x, weight, norm_weight) and _fused_wins(
        x, weight, RMS_NORM, fused, unfused
    ):
        return fused()
    return unfused()


def fused_add_rms_norm_linear(
    x: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(linear(RMSNorm(x + residual), weight), x + residual)."""

    def fused():
        return triton_rms_norm_gemv(x, residual, norm_weight, eps, weight)

    def unfused():
        normed, summed = fused_add_rms_norm_op(x, residual, norm_weight, eps)
        return linear_cuda(normed, weight), summed

    if (
        _fused_kernel_fits(x, weight, norm_weight)
        and residual.is_contiguous()
        and _fused_wins(x, weight, ADD_RMS_NORM, fused, unfused)
    ):
        return fused()
    return unfused()


def silu_and_mul_linear(gate_up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """linear(silu(gate) * up, weight) for gate_up = [gate | up]."""

    def fused():
        return triton_silu_and_mul_gemv(gate_up, weight)

    def unfused():
        return linear_cuda(silu_and_mul_cuda(gate_up), weight)

    if _fused_kernel_fits(gate_up, weight) and _fused_wins(
        gate_up, weight, SILU_AND_MUL, fused, unfused
    ):
        return fused()
    return unfused()


# ANCHOR_END: fused_ops


def _rms_norm_linear_fake(x, norm_weight, eps, weight):
    return x.new_empty((x.shape[0], weight.shape[0]))


def _fused_add_rms_norm_linear_fake(x, residual, norm_weight, eps, weight):
    return x.new_empty((x.shape[0], weight.shape[0])), torch.empty_like(x)


def _silu_and_mul_linear_fake(gate_up, weight):
    return gate_up.new_empty((gate_up.shape[0], weight.shape[0]))


# The nodes the fusion passes emit (torch.ops.mini_vllm.*). Inside them the unfused
# path calls the norm, the activation and the product as plain functions: at run time,
# one trip through the dispatcher per op is enough.
direct_register_custom_op("rms_norm_linear", rms_norm_linear, fake_impl=_rms_norm_linear_fake)
direct_register_custom_op(
    "fused_add_rms_norm_linear",
    fused_add_rms_norm_linear,
    fake_impl=_fused_add_rms_norm_linear_fake,
)
direct_register_custom_op(
    "silu_and_mul_linear", silu_and_mul_linear, fake_impl=_silu_and_mul_linear_fake
)
