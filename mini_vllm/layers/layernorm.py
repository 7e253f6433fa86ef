"""RMSNorm, with the residual add folded in.

vLLM counterpart: vllm/model_executor/layers/layernorm.py (`RMSNorm.forward_native`,
and `forward_cuda` for the one-kernel CUDA version: mini_vllm/layers/rmsnorm_triton.py);
Hugging Face: transformers/models/llama/modeling_llama.py (`LlamaRMSNorm`).

Llama normalises by the root mean square only (no mean subtraction, no bias). Like
vLLM, `forward(x, residual)` first adds the residual and returns the sum as the new
residual stream, so a decoder layer reads "add, then normalise" as one step (and a
fused kernel can do both in one pass over memory).

Which implementation runs is `CustomOp`'s choice (mini_vllm/layers/custom_op.py): the
spelled-out torch version for compilers, one ATen op on CPU, one Triton kernel on CUDA.
For compilation with fusion passes the norm is also a custom op, `mini_vllm::rms_norm`
and `mini_vllm::fused_add_rms_norm` (vLLM: `torch.ops._C.rms_norm` and
`fused_add_rms_norm`, the kernels of csrc/layernorm_kernels.cu): one node that the pass
in mini_vllm/compilation/fusion.py can fold into the matrix product after it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mini_vllm.layers.custom_op import CustomOp
from mini_vllm.layers.rmsnorm_triton import triton_rmsnorm, triton_rmsnorm_available
from mini_vllm.torch_utils import direct_register_custom_op

__all__ = ["RMSNorm", "rms_norm_native"]


# ANCHOR: rms_norm_native
def rms_norm_native(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Statistics in float32 even for bf16 activations: the mean of hundreds of squares
    # loses too much in 8 mantissa bits. The weight is applied after the cast back, in
    # the activation dtype, exactly as transformers does.
    xf = x.float()
    variance = xf.pow(2).mean(-1, keepdim=True)
    return (xf * torch.rsqrt(variance + eps)).to(x.dtype) * weight


# ANCHOR_END: rms_norm_native


def rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if triton_rmsnorm_available(x) and x.dtype == weight.dtype:
        return triton_rmsnorm(x, weight, eps)
    return rms_norm_native(x, weight, eps)


def _rms_norm_fake(x, weight, eps):
    return torch.empty_like(x)


def fused_add_rms_norm_op(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual), x + residual)."""
    if triton_rmsnorm_available(x) and x.dtype == weight.dtype and residual.stride(-1) == 1:
        return triton_rmsnorm(x, weight, eps, residual)
    summed = x + residual
    return rms_norm_native(summed, weight, eps), summed


def _fused_add_rms_norm_fake(x, residual, weight, eps):
    return torch.empty_like(x), torch.empty_like(x)


# Opaque nodes for the fusion passes (torch.ops.mini_vllm.*); eager code calls the functions.
direct_register_custom_op("rms_norm", rms_norm_op, fake_impl=_rms_norm_fake)
direct_register_custom_op(
    "fused_add_rms_norm", fused_add_rms_norm_op, fake_impl=_fused_add_rms_norm_fake
)


class RMSNorm(CustomOp):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    # ANCHOR: rmsnorm
    def forward_native(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return self._add_then_normalise(
            x, residual, lambda h: rms_norm_native(h, self.weight, self.eps)
        )

    def forward_cpu(self, x, residual=None):
        if x.dtype != torch.float32:
            return self.forward_native(x, residual)
        # One ATen op, half the time of the spelled-out version at batch 1; the same
        # arithmetic in float32 (vLLM: forward_cpu).
        return self._add_then_normalise(
            x, residual, lambda h: F.rms_norm(h, (self.hidden_size,), self.weight, self.eps)
        )

    def forward_cuda(self, x, residual=None):
        if (
            triton_rmsnorm_available(x)
            and x.dtype == self.weight.dtype
            and (residual is None or residual.stride(-1) == 1)
        ):
            # The add and the norm as one Triton kernel instead of about nine (vLLM: forward_cuda).
            return triton_rmsnorm(x, self.weight, self.eps, residual)
        return self.forward_native(x, residual)

    def forward_custom_op(self, x, residual=None):
        # Compiling for the fusion passes: one opaque node
        # the pass can fold into the product after it.
        if residual is None:
            return torch.ops.mini_vllm.rms_norm(x, self.weight, self.eps)
        return torch.ops.mini_vllm.fused_add_rms_norm(x, residual, self.weight, self.eps)

    @staticmethod
    def _add_then_normalise(x, residual, normalise):
        if residual is None:
            return normalise(x)
        # The add happens in the activation dtype, as in transformers, so bf16 runs drift
        # from the reference no more than they must; the sum is the new residual stream.
        x = x + residual
        return normalise(x), x

    # ANCHOR_END: rmsnorm

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}"
