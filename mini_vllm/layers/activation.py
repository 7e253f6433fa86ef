"""SwiGLU's gate: SiLU of one half times the other half.

vLLM counterpart: vllm/model_executor/layers/activation.py (`SiluAndMul`); nano-vllm:
nanovllm/layers/activation.py. The MLP computes gate and up projections as one
matrix product (`gate_up_proj`), so this layer receives them side by side in one
tensor `[..., 2 * intermediate]` and splits it.

`forward_native` is the whole layer: two ops once the split (a view) is made. Where the
kernel table is on (mini_vllm/_custom_ops.py), CUDA runs it as one Triton kernel
(mini_vllm/kernels/activation.py; vLLM: `torch.ops._C.silu_and_mul`), and the fusion pass
can fold it into the down projection after it (mini_vllm/compilation/passes/fusion.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mini_vllm import _custom_ops as ops
from mini_vllm.layers.custom_op import CustomOp

__all__ = ["SiluAndMul", "silu_and_mul_native"]


# ANCHOR: swiglu
def silu_and_mul_native(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


# ANCHOR_END: swiglu


class SiluAndMul(CustomOp):
    name = "silu_and_mul"

    def forward_native(self, gate_up: torch.Tensor) -> torch.Tensor:
        return silu_and_mul_native(gate_up)

    def forward_cuda(self, gate_up: torch.Tensor) -> torch.Tensor:
        # One kernel instead of two (the chunk is a view; then silu, and the product).
        return ops.silu_and_mul(gate_up)

    def forward_custom_op(self, gate_up: torch.Tensor) -> torch.Tensor:
        return ops.silu_and_mul_op(gate_up)  # one node for the fusion pass
