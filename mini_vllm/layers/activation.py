"""SwiGLU's gate: SiLU of one half times the other half.

vLLM counterpart: vllm/model_executor/layers/activation.py (`SiluAndMul`); nano-vllm:
nanovllm/layers/activation.py. The MLP computes gate and up projections as one
matrix product (`gate_up_proj`), so this layer receives them side by side in one
tensor `[..., 2 * intermediate]` and splits it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["SiluAndMul"]


class SiluAndMul(nn.Module):
    # ANCHOR: swiglu
    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up
    # ANCHOR_END: swiglu
