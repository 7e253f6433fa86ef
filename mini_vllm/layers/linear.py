"""Linear layers without bias, including the fused ones a Llama layer uses.

vLLM counterpart: vllm/model_executor/layers/linear.py (`ReplicatedLinear`,
`QKVParallelLinear`, `MergedColumnParallelLinear`, each with a `weight_loader`);
nano-vllm: nanovllm/layers/linear.py. There is no tensor parallelism here, so every
layer holds its whole matrix.

Fusing q, k and v (and gate and up) into one weight matrix turns three matrix
products into one: fewer kernel launches and one pass over the activations. A
checkpoint still stores the pieces separately, so each fused layer has a
`weight_loader(param, tensor, shard_id)` that copies one piece into its rows.

`forward_native` is `F.linear`. Where the kernel table is on (mini_vllm/_custom_ops.py),
decode-sized products take the Triton GEMV on CUDA (mini_vllm/kernels/gemv.py) and are
split over the cores on the CPU (mini_vllm/kernels/cpu.py), which also keeps a CPU weight
in the memory layout it reads fastest; the shape is `[out, in]` either way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mini_vllm import _custom_ops as ops
from mini_vllm.errors import UserError
from mini_vllm.layers.custom_op import CustomOp

__all__ = ["LinearBase", "MergedColumnLinear", "QKVLinear", "ReplicatedLinear"]


class LinearBase(CustomOp):
    """`y = x W^T` without bias."""

    name = "linear"

    def __init__(self, input_size: int, output_size: int) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        # torch.empty, not an initialiser: the weights are always overwritten by a
        # loader, and a 1B-parameter model should not pay for random init twice.
        weight = (
            ops.new_linear_weight(output_size, input_size)
            if self.use_kernels
            else torch.empty(output_size, input_size)
        )
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    # ANCHOR: linear_dispatch
    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)

    def forward_cuda(self, x: torch.Tensor) -> torch.Tensor:
        # The GEMV for decode rows (cuBLAS's reads the weights at a fraction of the memory's
        # speed), cuBLAS for the rest.
        return ops.linear(x, self.weight)

    forward_cpu = forward_cuda  # decode rows split over the cores

    def forward_compiled(self, x: torch.Tensor) -> torch.Tensor:
        # One compiled graph serves every row count: the choice is made for all of them.
        return ops.linear_compiled(x, self.weight)

    def forward_custom_op(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear_op(x, self.weight)  # one node the fusion passes can match

    # ANCHOR_END: linear_dispatch

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None
    ) -> None:
        _check_shape(param.data, loaded, f"{type(self).__name__}")
        param.data.copy_(loaded)

    def extra_repr(self) -> str:
        return f"in={self.input_size}, out={self.output_size}"


class ReplicatedLinear(LinearBase):
    """A plain `y = x W^T` (vLLM: the whole matrix on every GPU)."""


# ANCHOR: qkv_linear
class QKVLinear(LinearBase):
    """q, k and v projections as one matrix: rows `[q | k | v]`."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int) -> None:
        self.q_size = num_heads * head_dim
        self.kv_size = num_kv_heads * head_dim
        super().__init__(hidden_size, self.q_size + 2 * self.kv_size)
        self._offsets = {
            "q": (0, self.q_size),
            "k": (self.q_size, self.kv_size),
            "v": (self.q_size + self.kv_size, self.kv_size),
        }

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None
    ) -> None:
        if shard_id not in self._offsets:
            raise ValueError(f"QKVLinear shard must be 'q', 'k' or 'v', got {shard_id!r}")
        start, size = self._offsets[shard_id]
        rows = param.data.narrow(0, start, size)
        _check_shape(rows, loaded, f"QKVLinear shard {shard_id!r}")
        rows.copy_(loaded)


# ANCHOR_END: qkv_linear


class MergedColumnLinear(LinearBase):
    """Several projections of the same input stacked by rows (gate and up)."""

    def __init__(self, input_size: int, output_sizes: list[int]) -> None:
        super().__init__(input_size, sum(output_sizes))
        self.output_sizes = list(output_sizes)

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None
    ) -> None:
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(
                "MergedColumnLinear shard must be "
                f"0..{len(self.output_sizes) - 1}, got {shard_id!r}"
            )
        start = sum(self.output_sizes[:shard_id])
        rows = param.data.narrow(0, start, self.output_sizes[shard_id])
        _check_shape(rows, loaded, f"MergedColumnLinear shard {shard_id}")
        rows.copy_(loaded)


def _check_shape(target: torch.Tensor, loaded: torch.Tensor, what: str) -> None:
    if tuple(target.shape) != tuple(loaded.shape):
        raise UserError(
            f"{what}: checkpoint tensor has shape {tuple(loaded.shape)}, "
            f"the model expects {tuple(target.shape)}"
        )
