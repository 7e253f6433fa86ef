"""Linear layers without bias, whole or split over the tensor-parallel ranks.

vLLM counterpart: vllm/model_executor/layers/linear.py (`ReplicatedLinear`,
`ColumnParallelLinear`, `MergedColumnParallelLinear`, `QKVParallelLinear`,
`RowParallelLinear`, each with a `weight_loader`); nano-vllm: nanovllm/layers/linear.py.

Fusing q, k and v (and gate and up) into one weight matrix turns three matrix
products into one: fewer kernel launches and one pass over the activations. A
checkpoint still stores the pieces separately, so each fused layer has a
`weight_loader(param, tensor, shard_id)` that copies one piece into its rows.

Tensor parallelism (Megatron-LM's split, vLLM's names): a column-parallel layer keeps
`output_size / tp` rows of the weight on each rank, so each rank computes a slice of the
outputs and nothing is exchanged; a row-parallel layer keeps `input_size / tp` columns, so
each rank computes a partial sum of every output and an all-reduce adds them. A Llama layer
pairs them (qkv then o, gate_up then down): two all-reduces a layer. Every `weight_loader`
takes the whole checkpoint tensor and keeps this rank's shard. With one rank (the default,
and the single-process engine) every layer holds its whole matrix and no collective runs.

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
from mini_vllm.distributed.communication_op import (
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from mini_vllm.distributed.parallel_state import get_tp_group
from mini_vllm.errors import UserError
from mini_vllm.layers.custom_op import CustomOp

__all__ = [
    "ColumnParallelLinear",
    "LinearBase",
    "MergedColumnLinear",
    "MergedColumnParallelLinear",
    "QKVLinear",
    "QKVParallelLinear",
    "ReplicatedLinear",
    "RowParallelLinear",
]


class LinearBase(CustomOp):
    """`y = x W^T` without bias; the weight is this rank's `[out, in]` block.

    `input_size` / `output_size` are the whole layer's; a subclass that splits it passes
    this rank's share as `input_size_per_partition` / `output_size_per_partition`.
    """

    name = "linear"

    def __init__(
        self,
        input_size: int,
        output_size: int,
        input_size_per_partition: int | None = None,
        output_size_per_partition: int | None = None,
    ) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        group = get_tp_group()
        self.tp_size, self.tp_rank = group.world_size, group.rank_in_group
        self.input_size_per_partition = input_size_per_partition or input_size
        self.output_size_per_partition = output_size_per_partition or output_size
        output_size, input_size = self.output_size_per_partition, self.input_size_per_partition
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

    # ANCHOR: load_shard
    def _load_shard(self, param: nn.Parameter, loaded: torch.Tensor, dim: int, size: int) -> None:
        """Copy this rank's `size` slices of the whole tensor along `dim` into `param`."""
        shard = loaded.narrow(dim, self.tp_rank * size, size) if self.tp_size > 1 else loaded
        _check_shape(param.data, shard, type(self).__name__)
        param.data.copy_(shard)

    # ANCHOR_END: load_shard

    def extra_repr(self) -> str:
        shard = f", tp={self.tp_size}" if self.tp_size > 1 else ""
        return f"in={self.input_size}, out={self.output_size}{shard}"


class ReplicatedLinear(LinearBase):
    """A plain `y = x W^T`: the whole matrix on every rank."""


def _divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator:
        raise UserError(
            f"{what} ({numerator}) does not divide by tensor_parallel_size={denominator}; "
            "choose a tensor_parallel_size that divides it"
        )
    return numerator // denominator


# ANCHOR: column_parallel
class ColumnParallelLinear(LinearBase):
    """Rows `[rank * out / tp, (rank + 1) * out / tp)` of the weight: this rank computes that
    slice of the outputs. `gather_output`: all-gather the slices into the whole output."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        gather_output: bool = False,
        output_sizes: list[int] | None = None,
    ) -> None:
        tp_size = get_tp_group().world_size
        self.output_sizes = list(output_sizes or [output_size])
        per_partition = sum(_divide(size, tp_size, "an output size") for size in self.output_sizes)
        super().__init__(input_size, output_size, output_size_per_partition=per_partition)
        self.gather_output = gather_output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output_parallel = super().forward(x)
        if self.gather_output and self.tp_size > 1:
            return tensor_model_parallel_all_gather(output_parallel, dim=-1)
        return output_parallel

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None
    ) -> None:
        self._load_shard(param, loaded, dim=0, size=self.output_size_per_partition)


# ANCHOR_END: column_parallel


# ANCHOR: merged_column_parallel
class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several projections of the same input stacked by rows (gate and up), each split by
    rows over the ranks: this rank holds `[gate shard | up shard]`."""

    def __init__(self, input_size: int, output_sizes: list[int], gather_output: bool = False):
        super().__init__(input_size, sum(output_sizes), gather_output, output_sizes)

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None
    ) -> None:
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(
                "MergedColumnLinear shard must be "
                f"0..{len(self.output_sizes) - 1}, got {shard_id!r}"
            )
        tp = self.tp_size
        start = sum(self.output_sizes[:shard_id]) // tp
        size = self.output_sizes[shard_id] // tp
        rows = param.data.narrow(0, start, size)
        shard = loaded.narrow(0, self.tp_rank * size, size) if tp > 1 else loaded
        _check_shape(rows, shard, f"MergedColumnLinear shard {shard_id}")
        rows.copy_(shard)


# ANCHOR_END: merged_column_parallel


# ANCHOR: qkv_linear
class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections as one matrix: rows `[q | k | v]` of this rank's heads.

    Each rank takes `num_heads / tp` query heads. The KV heads are split the same way when
    there are at least as many as ranks; with fewer, each KV head is replicated on
    `tp / num_kv_heads` ranks (each rank keeps one), so that every query head still finds
    its KV head on its own rank (vLLM: `num_kv_head_replicas`).
    """

    # ANCHOR: qkv_shards
    def __init__(
        self, hidden_size: int, head_size: int, total_num_heads: int, total_num_kv_heads: int
    ) -> None:
        tp_size = get_tp_group().world_size
        self.head_size = head_size
        self.total_num_heads, self.total_num_kv_heads = total_num_heads, total_num_kv_heads
        self.num_heads = _divide(total_num_heads, tp_size, "the number of attention heads")
        if tp_size >= total_num_kv_heads:
            self.num_kv_heads = 1
            self.num_kv_head_replicas = _divide(tp_size, total_num_kv_heads, "")
        else:
            self.num_kv_heads = _divide(total_num_kv_heads, tp_size, "the number of KV heads")
            self.num_kv_head_replicas = 1
        self.q_size = self.num_heads * head_size  # this rank's
        self.kv_size = self.num_kv_heads * head_size
        # As vLLM: the KV sizes count a replicated head once per rank that holds it.
        output_sizes = [self.q_size * tp_size, self.kv_size * tp_size, self.kv_size * tp_size]
        output_size = (total_num_heads + 2 * total_num_kv_heads) * head_size
        super().__init__(hidden_size, output_size, output_sizes=output_sizes)
        self._offsets = {
            "q": (0, self.q_size),
            "k": (self.q_size, self.kv_size),
            "v": (self.q_size + self.kv_size, self.kv_size),
        }
        # ANCHOR_END: qkv_shards

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None
    ) -> None:
        if shard_id not in self._offsets:
            raise ValueError(f"QKVLinear shard must be 'q', 'k' or 'v', got {shard_id!r}")
        start, size = self._offsets[shard_id]
        rows = param.data.narrow(0, start, size)
        if self.tp_size > 1:
            # The replicas of one KV head are consecutive ranks.
            rank = self.tp_rank if shard_id == "q" else self.tp_rank // self.num_kv_head_replicas
            loaded = loaded.narrow(0, rank * size, size)
        _check_shape(rows, loaded, f"QKVLinear shard {shard_id!r}")
        rows.copy_(loaded)


# ANCHOR_END: qkv_linear


# ANCHOR: row_parallel
class RowParallelLinear(LinearBase):
    """Columns `[rank * in / tp, (rank + 1) * in / tp)` of the weight: this rank's input is
    its slice of the previous column-parallel output, and its product a partial sum of
    every output, which the all-reduce adds up (`reduce_results`)."""

    def __init__(self, input_size: int, output_size: int, reduce_results: bool = True) -> None:
        tp_size = get_tp_group().world_size
        per_partition = _divide(input_size, tp_size, "a row-parallel layer's input size")
        super().__init__(input_size, output_size, input_size_per_partition=per_partition)
        self.reduce_results = reduce_results

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output_parallel = super().forward(x)  # whichever kernel the layer runs
        if self.reduce_results and self.tp_size > 1:
            return tensor_model_parallel_all_reduce(output_parallel)
        return output_parallel

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None
    ) -> None:
        self._load_shard(param, loaded, dim=1, size=self.input_size_per_partition)


# ANCHOR_END: row_parallel

# The names of the single-GPU course, kept: with one rank they are these layers.
QKVLinear = QKVParallelLinear
MergedColumnLinear = MergedColumnParallelLinear


def _check_shape(target: torch.Tensor, loaded: torch.Tensor, what: str) -> None:
    if tuple(target.shape) != tuple(loaded.shape):
        raise UserError(
            f"{what}: checkpoint tensor has shape {tuple(loaded.shape)}, "
            f"the model expects {tuple(target.shape)}"
        )
