"""Linear layers without bias, including the fused ones a Llama layer uses.

vLLM counterpart: vllm/model_executor/layers/linear.py (`ReplicatedLinear`,
`QKVParallelLinear`, `MergedColumnParallelLinear`, each with a `weight_loader`);
nano-vllm: nanovllm/layers/linear.py. There is no tensor parallelism here, so every
layer holds its whole matrix.

Fusing q, k and v (and gate and up) into one weight matrix turns three matrix
products into one: fewer kernel launches and one pass over the activations. A
checkpoint still stores the pieces separately, so each fused layer has a
`weight_loader(param, tensor, shard_id)` that copies one piece into its rows.

Memory layout. The logical shape is always `[out, in]`, but on CPU a square or wide
matrix (at least as many outputs as inputs) is allocated column-major: MKL's matrix-vector product
reads it about 1.5-2x faster at batch 1 on the course's 2-core machine (measured;
see benchmarks/results/decode-cpu.md), and decode on CPU is exactly that product.
Choosing the layout at allocation time lets the loaders write straight into it, in
one pass (vLLM repacks CPU weights after loading instead, in
vllm/model_executor/layers/utils.py `dispatch_cpu_unquantized_gemm`). On GPUs every
weight stays row-major.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LinearBase", "MergedColumnLinear", "QKVLinear", "ReplicatedLinear", "cpu_gemv_layout", "new_weight"]


def cpu_gemv_layout(weight: torch.Tensor) -> torch.Tensor:
    """A copy of the `[out, in]` matrix stored column-major (strides `(1, out)`)."""
    return weight.t().contiguous().t()


def new_weight(output_size: int, input_size: int) -> torch.Tensor:
    """An uninitialised `[out, in]` weight on the default device, laid out for it."""
    if torch.get_default_device().type == "cpu" and output_size >= input_size:
        return torch.empty(input_size, output_size).t()
    return torch.empty(output_size, input_size)


class LinearBase(nn.Module):
    def __init__(self, input_size: int, output_size: int) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        # torch.empty, not an initialiser: the weights are always overwritten by a
        # loader, and a 1B-parameter model should not pay for random init twice.
        self.weight = nn.Parameter(new_weight(output_size, input_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
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
        self._offsets = {"q": (0, self.q_size), "k": (self.q_size, self.kv_size),
                         "v": (self.q_size + self.kv_size, self.kv_size)}

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
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

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(f"MergedColumnLinear shard must be 0..{len(self.output_sizes) - 1}, got {shard_id!r}")
        start = sum(self.output_sizes[:shard_id])
        rows = param.data.narrow(0, start, self.output_sizes[shard_id])
        _check_shape(rows, loaded, f"MergedColumnLinear shard {shard_id}")
        rows.copy_(loaded)


def _check_shape(target: torch.Tensor, loaded: torch.Tensor, what: str) -> None:
    if tuple(target.shape) != tuple(loaded.shape):
        raise ValueError(f"{what}: checkpoint tensor has shape {tuple(loaded.shape)}, "
                         f"the model expects {tuple(target.shape)}")
