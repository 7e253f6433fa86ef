"""Tensor parallelism's process groups and collectives (vLLM: vllm/distributed/)."""

from mini_vllm.distributed.communication_op import (
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from mini_vllm.distributed.parallel_state import (
    GroupCoordinator,
    destroy_distributed_environment,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    get_tp_group,
    init_distributed_environment,
    patch_tensor_parallel_group,
)

__all__ = [
    "GroupCoordinator",
    "destroy_distributed_environment",
    "get_tensor_model_parallel_rank",
    "get_tensor_model_parallel_world_size",
    "get_tp_group",
    "init_distributed_environment",
    "patch_tensor_parallel_group",
    "tensor_model_parallel_all_gather",
    "tensor_model_parallel_all_reduce",
]
