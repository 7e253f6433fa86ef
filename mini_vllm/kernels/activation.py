"""SwiGLU's gate, silu(gate) * up, as one Triton kernel (CUDA only).

vLLM counterpart: `silu_and_mul` in csrc/activation_kernels.cu, which
`SiluAndMul.forward_cuda` (vllm/model_executor/layers/activation.py) calls.

Why: the native version is two kernels (silu, then the product; the split is a view),
each a launch for a few kilobytes of work at decode; Inductor makes the same one kernel
of it under torch.compile. Where the fusion pass folds the gate into the down projection
(one decode row), the GEMV computes it in its prologue instead (mini_vllm/kernels/gemv.py).
"""

from __future__ import annotations

import torch

from mini_vllm.kernels.launch import cdiv, launch
from mini_vllm.layers.activation import silu_and_mul_native

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU machines
    triton = None

__all__ = ["silu_and_mul"]


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


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """`silu_and_mul_native` as one Triton kernel for `[rows, 2 * K]` CUDA rows; the torch
    version for anything else."""
    if triton is None or not gate_up.is_cuda or gate_up.dim() != 2 or gate_up.stride(-1) != 1:
        return silu_and_mul_native(gate_up)
    rows, k = gate_up.shape[0], gate_up.shape[1] // 2
    out = gate_up.new_empty((rows, k))
    if rows:
        grid = (rows, cdiv(k, 1024))
        launch(_silu_and_mul_kernel, grid, gate_up, out, k, gate_up.stride(0), 1024)  # BLOCK
    return out
