"""The collectives a tensor-parallel layer calls, on the tensor-parallel group.

vLLM counterpart: vllm/distributed/communication_op.py (`tensor_model_parallel_all_reduce`,
`tensor_model_parallel_all_gather`). With one rank each returns its input untouched.
"""

from __future__ import annotations

import torch

from mini_vllm.distributed.parallel_state import get_tp_group

__all__ = ["tensor_model_parallel_all_gather", "tensor_model_parallel_all_reduce"]


# ANCHOR: tp_collectives
def tensor_model_parallel_all_reduce(input_: torch.Tensor) -> torch.Tensor:
    """The sum of every rank's `input_` (a row-parallel layer's partial products)."""
    return get_tp_group().all_reduce(input_)


def tensor_model_parallel_all_gather(input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Every rank's `input_` side by side along `dim` (a column-parallel layer's slices)."""
    return get_tp_group().all_gather(input_, dim)


# ANCHOR_END: tp_collectives
