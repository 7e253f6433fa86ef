"""The ops the fusion passes match and the ops they put in their place, registered with
PyTorch's dispatcher.

vLLM counterpart: the ops its compile-time fusion passes match (`torch.ops._C.rms_norm`,
`fused_add_rms_norm`, `silu_and_mul`, `rotary_embedding`) and the fused kernels they put
in place of a pair, e.g. `torch.ops._C.fused_add_rms_norm_static_fp8_quant` for RMSNorm
then FP8 quantisation (vllm/compilation/fusion.py, `RMSNormQuantFusionPass`) and
`torch.ops._C.silu_and_mul_quant` (vllm/compilation/activation_quant_fusion.py). vLLM
fuses into the quantisation that feeds a GEMM; mini_vllm has no quantisation and fuses
into the product itself.

Matched (what a layer emits while Dynamo traces it for the passes, through the table's
`*_op` functions): `mini_vllm::rms_norm`, `fused_add_rms_norm`, `silu_and_mul`, `linear`,
`rotary_embedding`. Emitted: `rms_norm_linear`, `fused_add_rms_norm_linear`,
`silu_and_mul_linear` (mini_vllm/compilation/passes/fusion.py), and
`attention_with_rope` for RoPE folded into attention. `mini_vllm::linear` is also what a
compiled product calls when the fusion passes are off: one compiled graph serves every
token count, so the choice between the GEMV and cuBLAS is made when the op runs.

Why fuse: at batch 1 on a GPU a decode step is a chain of tiny kernels, and in a CUDA
graph each still costs its fixed few microseconds. An RMSNorm reads one row of a few
hundred values; the GEMV after it reads that row too. Done inside the GEMV (a prologue,
see mini_vllm/kernels/gemv.py), the norm costs no kernel of its own; same for SwiGLU's
`silu(gate) * up` before the down projection. Three kernels fewer per layer.

The fused kernels exist only for decode-sized batches on CUDA (one row, or up to 64 rows
in half precision: mini_vllm/kernels/gemv.py); every other case runs the two ops one
after the other, so each op is correct on every device and token count (the compiled
graph serves them all). Outputs never alias inputs, as custom ops require.
"""

from __future__ import annotations

import torch

from mini_vllm.compilation.attention_op import find_layer
from mini_vllm.kernels import cpu
from mini_vllm.kernels.activation import silu_and_mul
from mini_vllm.kernels.gemv import (
    ADD_RMS_NORM,
    RMS_NORM,
    SILU_AND_MUL,
    linear_cuda,
    skinny_is_faster,
    triton_gemv_available,
    triton_rms_norm_gemv,
    triton_silu_and_mul_gemv,
)
from mini_vllm.kernels.rms_norm import rms_norm_cuda
from mini_vllm.kernels.rotary_embedding import apply_deferred_rope
from mini_vllm.torch_utils import direct_register_custom_op

__all__ = [
    "attention_with_rope",
    "fused_add_rms_norm_linear",
    "rms_norm_linear",
    "rotary_embedding_op",
    "silu_and_mul_linear",
]


# ANCHOR: matched_ops
def rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return rms_norm_cuda(x, weight, eps)


def fused_add_rms_norm_op(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual), x + residual)."""
    return rms_norm_cuda(x, weight, eps, residual)


def rotary_embedding_op(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox RoPE of query `[T, H*D]` and key `[T, Hkv*D]` with a RotaryEmbedding's table.
    The fusion pass folds it into the attention after it."""
    q_rot, k_rot = cpu.rotary_embedding(positions, query, key, cos_sin_cache)
    return q_rot.clone(), k_rot.clone()  # a custom op's outputs share no storage


def _rms_norm_fake(x, weight, eps):
    return torch.empty_like(x)


def _fused_add_rms_norm_fake(x, residual, weight, eps):
    return torch.empty_like(x), torch.empty_like(x)


def _rotary_embedding_fake(positions, query, key, cos_sin_cache):
    return query.new_empty(query.shape), key.new_empty(key.shape)


def _silu_and_mul_fake(gate_up):
    return gate_up.new_empty((*gate_up.shape[:-1], gate_up.shape[-1] // 2))


def _linear_fake(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


direct_register_custom_op("rms_norm", rms_norm_op, fake_impl=_rms_norm_fake)
direct_register_custom_op(
    "fused_add_rms_norm", fused_add_rms_norm_op, fake_impl=_fused_add_rms_norm_fake
)
direct_register_custom_op("rotary_embedding", rotary_embedding_op, fake_impl=_rotary_embedding_fake)
direct_register_custom_op("silu_and_mul", silu_and_mul, fake_impl=_silu_and_mul_fake)
# Its kernel is `linear_cuda` itself, on the CPU too (F.linear there).
direct_register_custom_op("linear", linear_cuda, fake_impl=_linear_fake)
# ANCHOR_END: matched_ops


def _fused_kernel_fits(
    x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor | None = None
) -> bool:
    return (
        triton_gemv_available(x, weight)
        and x.is_contiguous()
        and (norm_weight is None or norm_weight.dtype == x.dtype)
    )


def _fused_wins(x, weight, prologue: int, fused, unfused) -> bool:
    """One row: the fused GEMV always (benchmarks/results/decode-graphs-cuda-fusion.md).
    More: where the fused skinny kernel measured faster than the two ops
    (mini_vllm/kernels/gemv.py `skinny_is_faster`)."""
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
        return linear_cuda(silu_and_mul(gate_up), weight)

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


# ANCHOR: attention_with_rope
def attention_with_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    output: torch.Tensor,
    layer_name: str,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> None:
    """`mini_vllm::attention` of q and k rotated by neox RoPE: what the fusion pass puts in
    place of `rotary_embedding` then `attention`. A backend that rotates inside its kernel
    (`accepts_rope`) gets q and k unrotated; any other gets them rotated first."""
    layer = find_layer(layer_name)
    if layer.impl is not None and layer.impl.accepts_rope:
        layer.run_backend(q, k, v, output, rope=(positions, cos_sin_cache))
    else:
        q, k = apply_deferred_rope((positions, cos_sin_cache), q, k)
        layer.run_backend(q, k, v, output)


def _attention_with_rope_fake(q, k, v, output, layer_name, positions, cos_sin_cache):
    return None


direct_register_custom_op(
    "attention_with_rope",
    attention_with_rope,
    mutates_args=["output"],
    fake_impl=_attention_with_rope_fake,
)


# ANCHOR_END: attention_with_rope
