"""What makes decode fast on a small CPU: products split over the cores, column-major
weights, RoPE without a copy, RMSNorm as one ATen op.

vLLM counterpart: vllm/model_executor/layers/utils.py (`dispatch_cpu_unquantized_gemm`,
which repacks a CPU weight after loading for the CPU's GEMM library) and the `forward_cpu`
methods of vLLM's layers (vllm/model_executor/layers/layernorm.py, rotary_embedding/).

Decode on a CPU is a string of matrix-vector products, each a pure read of its matrix,
and at batch 1 every torch op costs microseconds of overhead whatever its size. So:
- column-major storage: MKL's matrix-vector product streams a `[out, in]` matrix stored
  column-major (`weight.t()` a contiguous `[in, out]` array) faster than row-major for the
  square and wide matrices (benchmarks/results/decode-cpu.md). The layout is chosen when
  the weight is allocated, so the loaders write straight into it, in one pass (vLLM
  repacks after loading instead);
- both cores reading: one core alone pulls less from memory than two, and MKL does not
  split a matrix-vector product over its threads. `split_k_linear` does: each of the P
  threads takes a slice of the input dimension (a view of the `[in, out]` array, no copy),
  one batched product gives P partial outputs, and their sum is the answer. This is tensor
  parallelism in miniature: vLLM's `RowParallelLinear` splits the input dimension over GPUs
  the same way and all-reduces the partial sums. Under torch.compile the same split is
  traced (Inductor calls MKL's batched product and fuses the sum into what follows);
- fewer ops: RoPE rotates q and k as one strided view of the fused qkv output instead of
  concatenating them, and skips a cast to the dtype they already have; RMSNorm in float32
  is ATen's `rms_norm`, one op where the native version spells out six.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mini_vllm.layers.layernorm import rms_norm_native
from mini_vllm.layers.rotary_embedding import rotate_neox

__all__ = [
    "SPLIT_K_MAX_ROWS",
    "column_major",
    "linear",
    "linear_compiled",
    "new_linear_weight",
    "rms_norm",
    "rotary_embedding",
    "split_k_linear",
    "weight_slices",
]

# Up to this many rows (tokens) the split over threads pays: a decode step (one row per
# sequence) is memory-bound, and a short prompt is not far from it; from a few hundred rows
# on MKL's own threaded product is faster (benchmarks/results/decode-cpu.md).
SPLIT_K_MAX_ROWS = 64


def column_major(weight: torch.Tensor) -> torch.Tensor:
    """A copy of the `[out, in]` matrix stored column-major (strides `(1, out)`)."""
    return weight.t().contiguous().t()


def new_linear_weight(output_size: int, input_size: int) -> torch.Tensor:
    """An uninitialised `[out, in]` weight on the default device: column-major on the CPU."""
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


def _cached_slices(weight: torch.Tensor, parts: int) -> torch.Tensor:
    # Making the view is two tensor ops, microseconds at batch 1: it is kept on the
    # parameter itself, keyed by its storage too (a loader may swap the parameter's data).
    key = (parts, weight.data_ptr())
    cached = getattr(weight, "_split_k_slices", None)
    if cached is None or cached[0] != key:
        cached = (key, weight_slices(weight, parts))
        weight._split_k_slices = cached
    return cached[1]


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`F.linear(x, weight)`, split over the threads for decode-sized row counts."""
    parts = _splits_over(x, weight)
    if parts == 1 or x.shape[0] > SPLIT_K_MAX_ROWS:
        return F.linear(x, weight)
    return split_k_linear(x, _cached_slices(weight, parts))


def linear_compiled(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`linear` as Dynamo traces it: one graph serves every row count, so the split is
    traced for prefill too (each thread multiplies its slice for all rows)."""
    parts = _splits_over(x, weight)
    if parts > 1:
        return split_k_linear(x, weight_slices(weight, parts))
    return F.linear(x, weight)


def rms_norm(x, weight, eps, residual=None):
    """RMSNorm, with the residual add: in float32 ATen's one op (the same arithmetic), in
    other dtypes the native version, which rounds where transformers rounds."""
    if residual is not None:
        x = x + residual  # in the activation dtype, as the native version adds
    if x.dtype == torch.float32:
        normed = F.rms_norm(x, (x.shape[-1],), weight, eps)
    else:
        normed = rms_norm_native(x, weight, eps)
    return normed if residual is None else (normed, x)


# ANCHOR: rope_view
def rotary_embedding(positions, query, key, cos_sin_cache):
    """Neox RoPE of query `[T, Hq*D]` and key `[T, Hk*D]`: the native arithmetic, with q and
    k rotated as one strided view where they sit side by side (the fused qkv output)."""
    head_dim = cos_sin_cache.shape[-1]
    num_tokens = positions.shape[0]
    cos_sin = cos_sin_cache.index_select(0, positions)
    if cos_sin.dtype != query.dtype:  # a cast to the same dtype is still an op
        cos_sin = cos_sin.to(query.dtype)
    cos, sin = cos_sin.unbind(1)
    rotated = rotate_neox(_heads_side_by_side(query, key, head_dim), cos, sin)
    return rotated.view(num_tokens, -1).split([query.shape[-1], key.shape[-1]], dim=1)


def _heads_side_by_side(query: torch.Tensor, key: torch.Tensor, head_dim: int) -> torch.Tensor:
    """query `[T, Hq*D]` and key `[T, Hk*D]` as one `[T, Hq+Hk, D]` tensor.

    In a Llama layer q and k are neighbouring columns of the fused qkv output, so the pair
    already is one strided block of memory: viewing it costs nothing, where a concatenation
    copies both (and is one more op per layer). Anything else is copied.
    """
    num_tokens = query.shape[0]
    if (
        query.dim() == 2
        and key.dim() == 2
        and query.stride(1) == 1
        and key.stride(1) == 1
        and query.stride(0) == key.stride(0)
        and key.untyped_storage().data_ptr() == query.untyped_storage().data_ptr()
        and key.storage_offset() == query.storage_offset() + query.shape[1]
    ):
        num_heads = (query.shape[1] + key.shape[1]) // head_dim
        return query.as_strided((num_tokens, num_heads, head_dim), (query.stride(0), head_dim, 1))
    return torch.cat(
        (query.view(num_tokens, -1, head_dim), key.view(num_tokens, -1, head_dim)), dim=1
    )


# ANCHOR_END: rope_view
