"""RMSNorm, with the residual add folded in.

vLLM counterpart: vllm/model_executor/layers/layernorm.py (`RMSNorm.forward_native`, and
`forward_cuda`, which calls its CUDA kernel); Hugging Face:
transformers/models/llama/modeling_llama.py (`LlamaRMSNorm`).

Llama normalises by the root mean square only (no mean subtraction, no bias). Like
vLLM, `forward(x, residual)` first adds the residual and returns the sum as the new
residual stream, so a decoder layer reads "add, then normalise" as one step (and a
fused kernel can do both in one pass over memory).

`forward_native` is the whole layer. Where the kernel table is on
(mini_vllm/_custom_ops.py), `forward_cuda` and `forward_cpu` run the same arithmetic as
one kernel (mini_vllm/kernels/rms_norm.py, and ATen's `rms_norm` on the CPU).
"""

from __future__ import annotations

import torch
from torch import nn

from mini_vllm import _custom_ops as ops
from mini_vllm.layers.custom_op import CustomOp

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


class RMSNorm(CustomOp):
    name = "rms_norm"

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    # ANCHOR: rmsnorm
    def forward_native(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return rms_norm_native(x, self.weight, self.eps)
        # The add happens in the activation dtype, as in transformers, so bf16 runs drift
        # from the reference no more than they must; the sum is the new residual stream.
        x = x + residual
        return rms_norm_native(x, self.weight, self.eps), x

    def forward_cuda(self, x, residual=None):
        # The add and the norm as one kernel instead of about nine (vLLM: forward_cuda).
        return ops.rms_norm(x, self.weight, self.eps, residual)

    forward_cpu = forward_cuda  # ATen's one-op RMSNorm in float32 (vLLM: forward_cpu)

    def forward_custom_op(self, x, residual=None):
        # Traced for the fusion passes: one node the pass folds into the product after it.
        return ops.rms_norm_op(x, self.weight, self.eps, residual)

    # ANCHOR_END: rmsnorm

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}"
