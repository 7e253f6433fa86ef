"""mini_vllm's own kernels: the performance layer, reached only through the table of
mini_vllm/_custom_ops.py.

vLLM counterpart: csrc/ (its CUDA kernels) and vllm/attention/ops/ (its Triton attention),
which vLLM's layers reach only through vllm/_custom_ops.py and the attention backends.

Nothing in the engine imports this package: the table finds it by name when an op is
switched on (`custom_ops`, MINI_VLLM_CUSTOM_OPS). Without it, the engine runs every layer's
plain torch version, CUDA graphs and torch.compile included. The kernels may use the
core's native functions, for the inputs no kernel fits.

    launch.py            launching a compiled Triton kernel past Triton's front end
    gemv.py              decode's matrix products (GEMV, skinny GEMM), their tuning
    rms_norm.py          RMSNorm with the residual add
    rotary_embedding.py  RoPE of q and k, in place
    activation.py        SwiGLU's gate
    fused_ops.py         the ops the fusion passes match and emit
    paged_attention.py   paged decode attention, the KV write, the backend that runs them
    cpu.py               the CPU's: products split over the cores, column-major weights

The functions below are this package's side of the table: each picks, per call, the
kernel for the device and the inputs, or the native code where none fits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mini_vllm.kernels import cpu
from mini_vllm.kernels.activation import silu_and_mul
from mini_vllm.kernels.fused_ops import attention_with_rope  # registers the fusion ops
from mini_vllm.kernels.gemv import autotune_seconds, linear_cuda, triton_gemv_available
from mini_vllm.kernels.paged_attention import TritonPagedAttentionBackend, triton_available
from mini_vllm.kernels.rms_norm import rms_norm_cuda
from mini_vllm.kernels.rotary_embedding import rotary_embedding_cuda

__all__ = [
    "TritonPagedAttentionBackend",
    "attention_with_rope",
    "autotune_seconds",
    "linear",
    "linear_compiled",
    "linear_layout",
    "new_linear_weight",
    "paged_attention_backend",
    "rms_norm",
    "rotary_embedding",
    "silu_and_mul",
]

new_linear_weight = cpu.new_linear_weight


def rms_norm(x, weight, eps, residual=None):
    if x.is_cuda:
        return rms_norm_cuda(x, weight, eps, residual)
    return cpu.rms_norm(x, weight, eps, residual)


def rotary_embedding(positions, query, key, cos_sin_cache):
    if query.is_cuda:
        return rotary_embedding_cuda(positions, query, key, cos_sin_cache)
    return cpu.rotary_embedding(positions, query, key, cos_sin_cache)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if x.is_cuda:
        return linear_cuda(x, weight)
    return cpu.linear(x, weight)


def linear_compiled(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if x.device.type == "cpu":
        return cpu.linear_compiled(x, weight)
    if triton_gemv_available(x, weight):
        # The GEMV or cuBLAS, picked at run time inside the opaque op.
        return torch.ops.mini_vllm.linear(x, weight)
    return F.linear(x, weight)


def paged_attention_backend(device: torch.device) -> TritonPagedAttentionBackend | None:
    if device.type == "cuda" and triton_available():
        return TritonPagedAttentionBackend()
    return None


def linear_layout(weight: torch.Tensor) -> torch.Tensor:
    """`weight` as `linear` reads it fastest: a column-major copy of a row-major CPU matrix
    (a tied LM head, which the embedding lookup wants in rows), else itself."""
    if weight.device.type == "cpu" and weight.is_contiguous():
        return cpu.column_major(weight)
    return weight
