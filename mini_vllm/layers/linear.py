"""Linear layers without bias, including the fused ones a Llama layer uses.

vLLM counterpart: vllm/model_executor/layers/linear.py (`ReplicatedLinear`,
`QKVParallelLinear`, `MergedColumnParallelLinear`, each with a `weight_loader`);
nano-vllm: nanovllm/layers/linear.py. There is no tensor parallelism here, so every
layer holds its whole matrix.

Fusing q, k and v (and gate and up) into one weight matrix turns three matrix
products into one: fewer kernel launches and one pass over the activations. A
checkpoint still stores the pieces separately, so each fused layer has a
`weight_loader(param, tensor, shard_id)` that copies one piece into its rows.

Memory layout and the CPU product. The logical shape is always `[out, in]`, but on
CPU every matrix is allocated column-major (`weight.t()` is a contiguous `[in, out]`
array). Decode on CPU is a string of matrix-vector products, each a pure read of its
matrix, and two things make that read fast on the course's 2-core machine (measured;
see benchmarks/results/decode-cpu.md):
- column-major storage: MKL's matrix-vector product streams it 1.3-1.7x faster than
  row-major for the square and wide matrices;
- both cores reading: one core alone pulls about 18 GB/s from memory, two about 26.
  MKL does not split a matrix-vector product over its threads, so `forward_cpu`
  does: each of the P threads takes one slice of the input dimension (rows of the
  `[in, out]` array, a view, no copy), one batched product (`torch.bmm`, which runs
  its batch in parallel) gives P partial outputs, and their sum is the answer. This
  is tensor parallelism in miniature: vLLM's `RowParallelLinear` splits the input
  dimension over GPUs the same way and all-reduces the partial sums.
The compiled CPU loop (torch.compile, Inductor) gets the same split: Dynamo traces
the view, the batched product and the sum, Inductor calls MKL for the product and
fuses the sum into the code after it.
Choosing the layout at allocation time lets the loaders write straight into it, in
one pass (vLLM repacks CPU weights after loading instead, in
vllm/model_executor/layers/utils.py `dispatch_cpu_unquantized_gemm`). On GPUs every
weight stays row-major; decode-sized products (one row, or up to 64 in half precision)
take the Triton kernels of mini_vllm/layers/triton_gemv.py, all others `F.linear`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mini_vllm.errors import UserError
from mini_vllm.layers.custom_op import CustomOp
from mini_vllm.layers.triton_gemv import linear_cuda, triton_gemv_available

__all__ = [
    "LinearBase",
    "MergedColumnLinear",
    "QKVLinear",
    "ReplicatedLinear",
    "cpu_gemv_layout",
    "new_weight",
    "split_k_linear",
    "weight_slices",
]

# Up to this many rows (tokens) the split over threads pays: a decode step (one row per
# sequence) is memory-bound, and a short prompt is not far from it. Measured on the 2-core
# VM: 1.1-1.4x faster than MKL's own threaded product at 16-64 rows, even at 128, and
# slower for the 3072-wide matrix from 256 rows on.
SPLIT_K_MAX_ROWS = 64


def cpu_gemv_layout(weight: torch.Tensor) -> torch.Tensor:
    """A copy of the `[out, in]` matrix stored column-major (strides `(1, out)`)."""
    return weight.t().contiguous().t()


def new_weight(output_size: int, input_size: int) -> torch.Tensor:
    """An uninitialised `[out, in]` weight on the default device, laid out for it."""
    if torch.get_default_device().type == "cpu":
        return torch.empty(input_size, output_size).t()
    return torch.empty(output_size, input_size)


def weight_slices(weight: torch.Tensor, parts: int) -> torch.Tensor:
    """The column-major `[out, in]` weight as `[parts, in / parts, out]`: a view, no copy."""
    in_features = weight.shape[1]
    # weight.t() is the contiguous [in, out] array; cut it into `parts` blocks of rows.
    return weight.t().view(parts, in_features // parts, weight.shape[0])


# ANCHOR: split_k_linear
def split_k_linear(x: torch.Tensor, slices: torch.Tensor) -> torch.Tensor:
    """`x @ weight.T` as partial products over slices of the input dimension.

    x `[T, in]`; slices `[parts, in / parts, out]` from `weight_slices`.
    """
    parts, k, _ = slices.shape
    x_slices = x.view(x.shape[0], parts, k).transpose(0, 1)  # [parts, T, k], a view
    # One batched product: each thread reads its own slice of the matrix.
    partial = torch.bmm(x_slices, slices)  # [parts, T, out]
    return partial.sum(0)  # the "all-reduce" of the partial sums


# ANCHOR_END: split_k_linear


@torch.compiler.assume_constant_result
def _cpu_threads() -> int:
    # Under torch.compile the count is read once, at trace time, and baked into the graph.
    return torch.get_num_threads()


def _splits_over(x: torch.Tensor, weight: torch.Tensor) -> int:
    """Over how many CPU threads `x @ weight.T` can be split (1: not at all)."""
    parts = _cpu_threads()
    if parts > 1 and x.dim() == 2 and weight.stride(0) == 1 and weight.shape[1] % parts == 0:
        return parts
    return 1


class LinearBase(CustomOp):
    """`y = x W^T` without bias; which product computes it is chosen per call (CustomOp)."""

    def __init__(self, input_size: int, output_size: int) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        # torch.empty, not an initialiser: the weights are always overwritten by a
        # loader, and a 1B-parameter model should not pay for random init twice.
        self.weight = nn.Parameter(new_weight(output_size, input_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        self._cpu_slices: dict = {}  # forward_cpu's cache (a view of the weight, not a copy)

    # ANCHOR: linear_dispatch
    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)

    def forward_cpu(self, x: torch.Tensor) -> torch.Tensor:
        parts = _splits_over(x, self.weight)
        if parts == 1 or x.shape[0] > SPLIT_K_MAX_ROWS:
            return F.linear(x, self.weight)
        # The sliced view is kept: making it is two tensor ops, and at batch 1 on a small
        # CPU every op costs microseconds. Keyed by the
        # storage too: a loader may swap the parameter's data.
        key = (parts, self.weight.data_ptr())
        slices = self._cpu_slices.get(key)
        if slices is None:
            self._cpu_slices.clear()
            slices = self._cpu_slices[key] = weight_slices(self.weight, parts)
        return split_k_linear(x, slices)

    def forward_cuda(self, x: torch.Tensor) -> torch.Tensor:
        # Decode-sized products take the Triton kernels where they are faster
        # (mini_vllm/layers/triton_gemv.py).
        return linear_cuda(x, self.weight)

    def forward_compiled(self, x: torch.Tensor) -> torch.Tensor:
        # Dynamo traces one graph for every token count, so the choice the eager paths
        # make by row count is made here for all of them.
        if x.device.type == "cpu":
            parts = _splits_over(x, self.weight)
            if parts > 1:
                # The split for prefill too: each thread multiplies its slice for all rows.
                # Inductor calls MKL's batched product and fuses the sum into what follows.
                return split_k_linear(x, weight_slices(self.weight, parts))
        elif triton_gemv_available(x, self.weight):
            # The GEMV or cuBLAS, picked at run time inside the opaque op.
            return torch.ops.mini_vllm.linear(x, self.weight)
        return F.linear(x, self.weight)

    def forward_custom_op(self, x: torch.Tensor) -> torch.Tensor:
        # Compiling for the fusion passes (any device): one node the passes can match.
        return torch.ops.mini_vllm.linear(x, self.weight)

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
