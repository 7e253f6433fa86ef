"""Phase 07, lab 01 — shard a Llama layer's linear layers over the tensor-parallel ranks.

Every layer here is `y = x W^T` (no bias) with `W` of shape `[out, in]`, built for the
rank that constructs it: `get_tp_group()` says how many ranks there are (`tp_size`) and
which one this is (`tp_rank`); `LinearBase.__init__` (given, mini_vllm's) stores both and
makes `self.weight`, this rank's block, of shape
`[output_size_per_partition, input_size_per_partition]`. The layer's `weight_loader`
receives the WHOLE checkpoint tensor, as every rank reads the same file, and keeps this
rank's part. With one rank, every layer holds its whole matrix and communicates nothing.

What you build on (all given): `LinearBase.forward(x)` (the product with this rank's
block, `x @ self.weight.T`), `_check_shape(target, loaded, what)` (raises UserError when
two shapes differ), and the collectives of mini_vllm.distributed:
`tensor_model_parallel_all_reduce(x)` (the sum of every rank's `x`, a new tensor) and
`tensor_model_parallel_all_gather(x, dim)` (every rank's `x` side by side along `dim`, in
rank order). With one rank each returns its input.

The tests build each layer twice, whole (one rank) and sharded (two gloo ranks, one
process each), and check that the ranks together compute what the whole layer computes.
"""

from __future__ import annotations

import torch
from torch import nn

from mini_vllm.distributed.communication_op import (
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from mini_vllm.distributed.parallel_state import get_tp_group
from mini_vllm.errors import UserError
from mini_vllm.layers.linear import LinearBase as _WholeLinearBase
from mini_vllm.layers.linear import _check_shape  # noqa: F401  (yours to use)

__all__ = [
    "ColumnParallelLinear",
    "LinearBase",
    "MergedColumnParallelLinear",
    "QKVParallelLinear",
    "RowParallelLinear",
    "UserError",
    "tensor_model_parallel_all_gather",
    "tensor_model_parallel_all_reduce",
]


# -- step 1: a rank's shard of the weights ------------------------------------------------


def _divide(numerator: int, denominator: int, what: str) -> int:
    """Each rank's equal share of `numerator` things split over `denominator` ranks.

    Guarantees: ranks never get shares of different sizes; a split that would need them
    raises UserError, and its message names `what`, the number, and the rank count, so
    that a user knows which size to change.

    Example: _divide(12, 2, "an output size") -> 6.
    """
    raise NotImplementedError("TODO: step 1")


class LinearBase(_WholeLinearBase):
    """mini_vllm's LinearBase (construction, forward, the whole-weight loader), with the
    helper the parallel layers share left to you."""

    def _load_shard(self, param: nn.Parameter, loaded: torch.Tensor, dim: int, size: int) -> None:
        """Copy this rank's `size` slices of the whole tensor `loaded` along `dim` into `param`.

        Guarantees: the ranks' shards, in rank order, tile `loaded` along `dim` without
        overlap; with one rank `param` receives all of `loaded`. `param` keeps its own
        storage and dtype (a bfloat16 checkpoint loads into a float32 layer as float32),
        `loaded` is left as it was, and a later change to `loaded` does not reach `param`.
        A shard whose shape is not `param`'s raises UserError (`_check_shape`).

        Example: with 2 ranks, a whole tensor of 6 rows and `dim=0, size=3`, rank 1's
        `param` receives rows 3, 4 and 5.
        """
        raise NotImplementedError("TODO: step 1")


class ColumnParallelLinear(LinearBase):
    """This rank computes its slice of the outputs: `output_size / tp` of them.
    `gather_output`: every rank returns the whole output instead of its slice."""

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
        """Step 2. `x` is the whole input `[tokens, input_size]`, the same on every rank.

        Guarantees: returns this rank's outputs: rank r's are columns
        `[r * out / tp, (r + 1) * out / tp)` of the whole layer's `x W^T`; with
        `gather_output`, the whole `[tokens, output_size]` on every rank. `x` is left as it
        was; the output has `x`'s dtype. One rank: exactly the whole layer's output.

        Example: output_size 12 on 2 ranks, x of 5 tokens: rank 1 returns a [5, 6] tensor,
        equal to the whole layer's output columns 6 to 11.
        """
        raise NotImplementedError("TODO: step 2")

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None
    ) -> None:
        """Step 1. Keep this rank's part of the whole checkpoint weight `loaded`
        (`[output_size, input_size]`), so that `forward` computes this rank's outputs.

        Example: ColumnParallelLinear(16, 12) on 2 ranks: each rank's weight is [6, 16].
        Which 6-by-16 block of the whole, for rank 1, is for you to decide.
        """
        raise NotImplementedError("TODO: step 1")


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several projections of the same input stacked into one layer (a Llama MLP's gate and
    up, `output_sizes = [I, I]`), split over the ranks so that each rank can apply SwiGLU to
    its own outputs: it splits its outputs in half, gate then up, and multiplies
    `silu(gate) * up` element by element."""

    def __init__(self, input_size: int, output_sizes: list[int], gather_output: bool = False):
        super().__init__(input_size, sum(output_sizes), gather_output, output_sizes)

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None
    ) -> None:
        """Step 3. `loaded` is ONE projection's whole weight (`[output_sizes[shard_id],
        input_size]`), `shard_id` its index (0 gate, 1 up); the checkpoint stores them apart,
        so the loader is called once per projection.

        Guarantees: after both loads, the first half of this rank's outputs are gate
        outputs and the second half the matching up outputs (the same output features, in
        the same order), so that SwiGLU on each rank gives that rank's slice of the whole
        layer's SwiGLU. A `shard_id` that is not 0..len(output_sizes) - 1 raises
        ValueError; a wrong shape UserError; `loaded` is left as it was.

        Example: MergedColumnParallelLinear(16, [8, 8]) on 2 ranks: each rank's weight is
        [8, 16], and its first 4 rows come from gate's weight. Which 4 is yours to find.
        """
        raise NotImplementedError("TODO: step 3")


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v as one layer, split by attention heads: each rank computes q, k and v for
    its own heads, `[q | k | v]`, and runs attention on them alone.

    Each rank takes `num_heads = total_num_heads / tp` query heads. The KV heads split the
    same way while there are at least as many as ranks (`num_kv_head_replicas` 1); with
    fewer, each rank keeps one KV head and each KV head is held by `num_kv_head_replicas`
    ranks. Grouped-query attention: query head j reads KV head
    `j // (total_num_heads / total_num_kv_heads)`.
    """

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

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None
    ) -> None:
        """Step 4. `loaded` is the whole q, k or v weight (`shard_id` "q", "k" or "v"):
        `[total heads of that kind * head_size, hidden_size]`, heads in order.

        Guarantees: this rank's weight is `[its q heads | its KV head(s)' k | their v]`
        (sizes `self._offsets` gives), and every query head of this rank finds, among
        this rank's KV heads, the one grouped-query attention pairs it with. Another
        `shard_id` raises ValueError; a wrong shape UserError; `loaded` is left as it was.

        Example: 4 query heads and 2 KV heads of size 2 on 2 ranks: rank 1 keeps query
        heads 2 and 3 and KV head 1 (weight rows: 4 of q, 2 of k, 2 of v).
        """
        raise NotImplementedError("TODO: step 4")


class RowParallelLinear(LinearBase):
    """The layer after a column-parallel one: this rank's input is the slice of features
    the column-parallel layer left on it, `input_size / tp` of them."""

    def __init__(self, input_size: int, output_size: int, reduce_results: bool = True) -> None:
        tp_size = get_tp_group().world_size
        per_partition = _divide(input_size, tp_size, "a row-parallel layer's input size")
        super().__init__(input_size, output_size, input_size_per_partition=per_partition)
        self.reduce_results = reduce_results

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Step 2. `x` is this rank's slice of the input: features
        `[r * in / tp, (r + 1) * in / tp)` of the whole input, `[tokens, in / tp]`.

        Guarantees: every rank returns the whole layer's output `[tokens, output_size]`
        for the whole input; with `reduce_results=False`, this rank's own contribution
        instead, which the caller promises to combine itself. `x` is left as it was; the
        output has `x`'s dtype. One rank: exactly the whole layer's output.

        Example: RowParallelLinear(12, 16) on 2 ranks: rank 1 gets x[:, 6:12] of the whole
        x and returns a [tokens, 16] tensor equal to the whole layer's output.
        """
        raise NotImplementedError("TODO: step 2")

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None
    ) -> None:
        """Step 1. Keep this rank's part of the whole checkpoint weight `loaded`
        (`[output_size, input_size]`), the part that multiplies this rank's input slice.

        Example: RowParallelLinear(12, 16) on 2 ranks: each rank's weight is [16, 6].
        """
        raise NotImplementedError("TODO: step 1")
