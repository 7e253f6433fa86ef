"""How many KV blocks the engine gets, decided and checked before anything is allocated.

vLLM counterpart: vllm/v1/core/kv_cache_utils.py (`get_kv_cache_config`: the number of
blocks is the memory given to the cache over the bytes of one block;
`check_enough_kv_cache_memory`: a cache that cannot hold one request of `max_model_len`
tokens is refused with a ValueError that gives the longest length it could hold),
the cache knobs of vllm/config/cache.py (`num_gpu_blocks_override`,
`kv_cache_memory_bytes`) and, for the CPU default, `VLLM_CPU_KVCACHE_SPACE` in
vllm/envs.py (4 GiB unless set).

The size comes from, in this order: `num_kv_blocks`; `kv_cache_memory_bytes`; or by
default enough blocks for `max_num_seqs` requests of `max_model_len` tokens, which on
CPU is capped at 1 GiB: SmolLM2's full rule would be 5.6 GiB, and 1 GiB still holds
23,000 of its tokens (a laptop running the course has other things to keep in RAM).
Like vLLM, an explicit `max_model_len` longer than the cache holds is refused, not
shortened; unlike vLLM, whose cache takes whatever memory is left, the default here
is a fixed rule, so the same command gives the same cache on every machine.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from mini_vllm.engine.engine_config import EngineConfig
from mini_vllm.errors import UserError
from mini_vllm.models.config import LlamaConfig

__all__ = ["CPU_DEFAULT_KV_CACHE_BYTES", "KVCachePlan", "available_memory_bytes", "plan_kv_cache"]

CPU_DEFAULT_KV_CACHE_BYTES = 2**30


@dataclass(frozen=True)
class KVCachePlan:
    max_model_len: int  # tokens one request may reach (prompt + generated)
    num_blocks: int
    block_size: int
    bytes_per_block: int  # keys and values of block_size tokens, every layer

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def num_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    def describe(self) -> str:
        return (
            f"{self.num_blocks} blocks of {self.block_size} tokens "
            f"({self.num_tokens} tokens, {_size(self.num_bytes)})"
        )


def available_memory_bytes(device: torch.device) -> int | None:
    """Memory free for a new allocation on `device`, or None where it cannot be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:  # Linux: what the kernel could give without swapping
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _size(num_bytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.1f} {unit}"
    return f"{num_bytes} bytes"


# ANCHOR: plan_kv_cache
def plan_kv_cache(
    config: EngineConfig,
    model_config: LlamaConfig,
    dtype: torch.dtype,
    device: torch.device,
    available_bytes: int | None = None,
) -> KVCachePlan:
    """Decide max_model_len and the number of KV blocks, or say which setting to change."""
    model_len = model_config.max_position_embeddings
    if config.max_model_len is not None and config.max_model_len > model_len:
        raise UserError(
            f"max_model_len={config.max_model_len} is longer than the model's context "
            f"({model_len} positions); give max_model_len <= {model_len} or leave it unset"
        )
    max_model_len = config.max_model_len or model_len
    config.scheduler_config(max_model_len)  # without chunking, a whole prompt fits a step
    bytes_per_token = model_config.num_hidden_layers * 2 * model_config.kv_size * dtype.itemsize
    bytes_per_block = config.block_size * bytes_per_token
    if config.num_kv_blocks is not None:
        num_blocks = config.num_kv_blocks
    elif config.kv_cache_memory_bytes is not None:
        num_blocks = config.kv_cache_memory_bytes // bytes_per_block
    else:
        num_blocks = config.max_num_seqs * math.ceil(max_model_len / config.block_size)
        if device.type == "cpu":
            num_blocks = min(num_blocks, CPU_DEFAULT_KV_CACHE_BYTES // bytes_per_block)
    plan = KVCachePlan(max_model_len, num_blocks, config.block_size, bytes_per_block)
    if plan.num_tokens < max_model_len:
        longest = plan.num_tokens
        raise UserError(
            f"the KV cache ({plan.describe()}) cannot hold one request of max_model_len="
            f"{max_model_len} tokens, so a long request could never finish; give "
            f"max_model_len <= {longest}, or a larger cache: num_kv_blocks >= "
            f"{math.ceil(max_model_len / config.block_size)} or kv_cache_memory_bytes >= "
            f"{math.ceil(max_model_len / config.block_size) * bytes_per_block}"
        )
    # The model runner's persistent step inputs (mini_vllm/engine/model_runner.py): four
    # int64 rows and a block table row for each of max_num_batched_tokens tokens.
    table_width = math.ceil(max_model_len / config.block_size)
    buffer_bytes = 8 * config.max_num_batched_tokens * (4 + table_width)
    if available_bytes is not None and plan.num_bytes + buffer_bytes > available_bytes:
        raise UserError(
            f"the KV cache ({plan.describe()}) and the step input buffers "
            f"({_size(buffer_bytes)} for max_num_batched_tokens={config.max_num_batched_tokens})"
            f" need {_size(plan.num_bytes + buffer_bytes)}, but only {_size(available_bytes)} "
            f"is free on {device}; lower max_num_seqs ({config.max_num_seqs}), "
            f"max_num_batched_tokens or max_model_len ({max_model_len}), or give the cache's "
            "size with num_kv_blocks or kv_cache_memory_bytes"
        )
    return plan


# ANCHOR_END: plan_kv_cache
