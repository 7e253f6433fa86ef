"""SwiGLU's gate: SiLU of one half times the other half.

vLLM counterpart: vllm/model_executor/layers/activation.py (`SiluAndMul`); nano-vllm:
nanovllm/layers/activation.py. The MLP computes gate and up projections as one
matrix product (`gate_up_proj`), so this layer receives them side by side in one
tensor `[..., 2 * intermediate]` and splits it.

For compilation with fusion passes it is also the custom op `mini_vllm::silu_and_mul`
(vLLM: `torch.ops._C.silu_and_mul`, csrc/activation_kernels.cu), which
mini_vllm/compilation/fusion.py folds into the down projection after it. Where the op
stays (more than one row), and eagerly on CUDA (vLLM's `forward_cuda`), it is one Triton
kernel, as Inductor would have made.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mini_vllm.layers.custom_op import CustomOp
from mini_vllm.layers.triton_launch import cdiv, launch
from mini_vllm.torch_utils import direct_register_custom_op

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU machines
    triton = None

__all__ = ["SiluAndMul", "silu_and_mul_cuda", "silu_and_mul_native"]


# ANCHOR: swiglu
def silu_and_mul_native(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


# ANCHOR_END: swiglu


if triton is not None:

    @triton.jit
    def _silu_and_mul_kernel(x_ptr, out_ptr, K, stride_x, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < K
        gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
        up = tl.load(x_ptr + row * stride_x + K + cols, mask=mask, other=0.0)
        g = gate.to(tl.float32)
        activated = (g * tl.sigmoid(g)).to(gate.dtype)  # rounded where torch rounds
        tl.store(
            out_ptr + row * K + cols,
            (activated.to(tl.float32) * up.to(tl.float32)).to(gate.dtype),
            mask=mask,
        )


def silu_and_mul_cuda(gate_up: torch.Tensor) -> torch.Tensor:
    """`silu_and_mul_native` as one Triton kernel for `[rows, 2 * K]` CUDA rows (vLLM:
    `SiluAndMul.forward_cuda`); the torch version for anything else."""
    if triton is None or not gate_up.is_cuda or gate_up.dim() != 2 or gate_up.stride(-1) != 1:
        return silu_and_mul_native(gate_up)
    rows, k = gate_up.shape[0], gate_up.shape[1] // 2
    out = gate_up.new_empty((rows, k))
    if rows:
        grid = (rows, cdiv(k, 1024))
        launch(_silu_and_mul_kernel, grid, gate_up, out, k, gate_up.stride(0), 1024)  # BLOCK
    return out


def _silu_and_mul_fake(gate_up):
    return gate_up.new_empty((*gate_up.shape[:-1], gate_up.shape[-1] // 2))


# `torch.ops.mini_vllm.silu_and_mul`, one node for the fusion pass; its kernel is the function.
direct_register_custom_op("silu_and_mul", silu_and_mul_cuda, fake_impl=_silu_and_mul_fake)


class SiluAndMul(CustomOp):
    def forward_native(self, gate_up: torch.Tensor) -> torch.Tensor:
        return silu_and_mul_native(gate_up)

    def forward_cuda(self, gate_up: torch.Tensor) -> torch.Tensor:
        # One kernel instead of two (the chunk is a view; then silu, and the product).
        return silu_and_mul_cuda(gate_up)

    def forward_custom_op(self, gate_up: torch.Tensor) -> torch.Tensor:
        return torch.ops.mini_vllm.silu_and_mul(gate_up)  # one node for the fusion pass
