"""How many KV blocks the engine gets, decided and checked before anything is allocated.

vLLM counterpart: vllm/v1/core/kv_cache_utils.py (`get_kv_cache_config`: the number of
blocks is the memory given to the cache over the bytes of one block;
`check_enough_kv_cache_memory`: a cache that cannot hold one request of `max_model_len`
tokens is refused with a ValueError that gives the longest length it could hold),
the cache knobs of vllm/config/cache.py (`gpu_memory_utilization`,
`num_gpu_blocks_override`, `kv_cache_memory_bytes`), the GPU worker's
`determine_available_memory` (vllm/v1/worker/gpu_worker.py) and, for the CPU default,
`VLLM_CPU_KVCACHE_SPACE` in vllm/envs.py (4 GiB unless set).

The size comes from, in this order: `num_kv_blocks`; `kv_cache_memory_bytes`; or by
default:

- on CUDA, as vLLM, what `gpu_memory_utilization` leaves: that fraction of the GPU's
  total memory, less what this process already holds there (the weights, loaded by
  then) and less what the forward passes will need beside the cache
  (`forward_reserve_bytes`). vLLM measures that last part with a profiling run, a dummy
  forward of max_num_batched_tokens tokens; mini_vllm estimates it from the model's
  shape. Then, unlike vLLM, the blocks are capped at what max_num_seqs requests of
  max_model_len tokens can ever use: more blocks would never be touched, and a small
  engine (a test's, a notebook's) stays small on a large GPU.
- on CPU, a fixed rule: enough blocks for max_num_seqs requests of max_model_len
  tokens, capped at 1 GiB. SmolLM2's full rule would be 5.6 GiB, and 1 GiB still holds
  23,000 of its tokens (a laptop running the course has other things to keep in RAM);
  the same command gives the same cache on every machine. The same rule, without the
  cap, sizes a CUDA cache whose device memory was not read.

Like vLLM, an explicit `max_model_len` longer than the cache holds is refused, not
shortened.
"""

from __future__ import annotations

import gc
import math
import os
from dataclasses import dataclass
from typing import TypedDict

import torch

from mini_vllm.attention.paged import SCRATCH_BLOCKS
from mini_vllm.config.capture_sizes import default_capture_sizes, normalize_capture_sizes
from mini_vllm.config.compilation import CUDAGraphMode
from mini_vllm.engine.engine_config import EngineConfig
from mini_vllm.errors import UserError
from mini_vllm.models.config import LlamaConfig

__all__ = [
    "CPU_DEFAULT_KV_CACHE_BYTES",
    "DeviceMemory",
    "KVCachePlan",
    "available_memory_bytes",
    "device_memory",
    "forward_reserve_bytes",
    "graph_pool_bytes",
    "plan_kv_cache",
    "step_buffer_bytes",
]

CPU_DEFAULT_KV_CACHE_BYTES = 2**30

# What an engine holds on a GPU beyond the tensors counted below. Outside PyTorch's
# allocator, which memory_reserved cannot see: the CUDA context with the kernel images
# loaded into it (PyTorch's, Triton's, cuBLAS's) and the instantiated CUDA graphs, 0.6 GiB
# eager and 1.0 GiB with the default ladder's graphs on an H100. Inside it: the segments
# that warm-up and capture leave cached, about 1 GiB for SmolLM2-135M as for Llama-3.1-8B.
FIXED_RESERVE_BYTES = 2 * 2**30
# The per-token activations counted below are the tensors alive at one point of a layer;
# the copies around them (a kernel's output before its input is freed, the allocator's
# rounding to its block sizes) are covered by counting them twice.
ACTIVATION_SLACK = 2
# Full graphs' memory a captured token, in hidden_size elements (their outputs, and the
# intermediates they share). The default ladder's FULL_DECODE_ONLY graphs held 58, 72 and
# 104 MiB on an H100 for SmolLM2-135M, Llama-3.2-1B and Llama-3.1-8B shapes: 5, 1.8 and
# 1.3 x hidden_size a token.
FULL_GRAPH_ELEMENTS_PER_TOKEN = 8
# The sampler's copies of each row of logits, in float32 widths: the logits, the
# probabilities, and top-k / top-p's sorted values (one) with their int64 indices (two).
SAMPLER_ROW_COPIES = 5


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


class DeviceMemory(TypedDict):
    """What plan_kv_cache knows of the device's memory, in bytes: its keyword arguments."""

    available_bytes: int | None  # free for a new allocation; None where it cannot be read
    total_bytes: int | None  # the GPU's capacity; None on CPU
    in_use_bytes: int  # what this process holds on the GPU already


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


def device_memory(device: torch.device) -> DeviceMemory:
    """Free, total and in-use memory of `device`, as plan_kv_cache takes them."""
    if device.type != "cuda":
        return DeviceMemory(
            available_bytes=available_memory_bytes(device), total_bytes=None, in_use_bytes=0
        )
    # In use is what PyTorch's allocator holds for this process (memory_reserved), not
    # the device-wide total - free: gpu_memory_utilization is this engine's share of the
    # GPU, as in vLLM, where two engines at 0.45 each share one GPU; what other processes
    # hold is checked against the free memory instead. The allocator first hands back its
    # cached free blocks (an engine dropped before, the loader's temporaries), which the
    # KV cache may take. The memory PyTorch does not see is in FIXED_RESERVE_BYTES.
    gc.collect()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    return DeviceMemory(
        available_bytes=free, total_bytes=total, in_use_bytes=torch.cuda.memory_reserved(device)
    )


def _size(num_bytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.1f} {unit}"
    return f"{num_bytes} bytes"


def step_buffer_bytes(config: EngineConfig, max_model_len: int) -> int:
    """The model runner's persistent step inputs (mini_vllm/engine/model_runner.py): five
    int64 rows (query_start_loc one entry longer) and a block table row for each of
    max_num_batched_tokens tokens."""
    table_width = math.ceil(max_model_len / config.block_size)
    return 8 * (config.max_num_batched_tokens * (5 + table_width) + 1)


def _capture_sizes(config: EngineConfig) -> list[int]:
    if config.cudagraph_mode is CUDAGraphMode.NONE:
        return []
    if config.cudagraph_capture_sizes is not None:
        return normalize_capture_sizes(
            config.cudagraph_capture_sizes, config.max_num_batched_tokens
        )
    return default_capture_sizes(config.max_num_seqs, config.max_num_batched_tokens)


def graph_pool_bytes(config: EngineConfig, model_config: LlamaConfig, dtype: torch.dtype) -> int:
    """The CUDA graphs' private pool, estimated from the capture sizes.

    A piecewise graph keeps each piece's outputs (the next piece's inputs, at fixed
    addresses) for every captured size: per token and layer, about the attention's q, k,
    v and output and the residual stream, counted as 2 x (hidden + q_size + kv_size)
    elements. On an H100 the pool held 3.6 to 3.9 x hidden_size elements per token and
    layer for SmolLM2-135M, Llama-3.2-1B and Llama-3.1-8B shapes; the count gives 4.5 to
    4.7. Any mode but FULL_DECODE_ONLY may run piecewise graphs (FULL falls back to
    FULL_AND_PIECEWISE where attention cannot be captured whole). Full graphs share
    their intermediates: FULL_GRAPH_ELEMENTS_PER_TOKEN x hidden_size a captured token.
    """
    sizes = _capture_sizes(config)
    if config.cudagraph_mode is CUDAGraphMode.FULL_DECODE_ONLY:
        per_token = FULL_GRAPH_ELEMENTS_PER_TOKEN * model_config.hidden_size
    else:
        per_layer = 2 * (model_config.hidden_size + model_config.q_size + model_config.kv_size)
        per_token = model_config.num_hidden_layers * per_layer
    return sum(sizes) * per_token * dtype.itemsize


def forward_reserve_bytes(
    config: EngineConfig, model_config: LlamaConfig, dtype: torch.dtype, max_model_len: int
) -> int:
    """Device memory the engine needs beside the weights and the KV cache, estimated.

    vLLM measures this: a profiling run of max_num_batched_tokens dummy tokens, then the
    allocator's peak. mini_vllm adds up, from the model's shape:
    - one eager step's activations: per token, the residual stream and the normed input
      (2 x hidden_size) and the MLP's gate-up product with its activation
      (3 x intermediate_size), the largest set alive at once in a Llama layer, counted
      ACTIVATION_SLACK times, for max_num_batched_tokens tokens;
    - the CUDA graphs' private pool (`graph_pool_bytes`);
    - the logits and the sampler's copies: max_num_seqs rows of the vocabulary,
      SAMPLER_ROW_COPIES float32 widths;
    - the persistent step buffers (`step_buffer_bytes`, exact);
    - FIXED_RESERVE_BYTES for the CUDA context, the libraries, the graphs' own driver
      memory and the allocator's cached segments.
    """
    hidden, intermediate = model_config.hidden_size, model_config.intermediate_size
    per_token = ACTIVATION_SLACK * (2 * hidden + 3 * intermediate) * dtype.itemsize
    sampler = SAMPLER_ROW_COPIES * config.max_num_seqs * model_config.vocab_size * 4
    return (
        per_token * config.max_num_batched_tokens
        + graph_pool_bytes(config, model_config, dtype)
        + sampler
        + step_buffer_bytes(config, max_model_len)
        + FIXED_RESERVE_BYTES
    )


def _blocks_gpu_memory_utilization_leaves(
    config: EngineConfig,
    model_config: LlamaConfig,
    dtype: torch.dtype,
    device: torch.device,
    max_model_len: int,
    bytes_per_block: int,
    total_bytes: int,
    in_use_bytes: int,
) -> int:
    """KV blocks in this engine's share of the GPU, or a UserError if one request won't fit."""
    share = int(config.gpu_memory_utilization * total_bytes)
    reserve = forward_reserve_bytes(config, model_config, dtype, max_model_len)
    budget = max(share - in_use_bytes - reserve, 0)
    num_blocks = max(budget // bytes_per_block - SCRATCH_BLOCKS, 0)
    blocks_per_request = math.ceil(max_model_len / config.block_size)
    if num_blocks < blocks_per_request:
        longest = num_blocks * config.block_size
        shorter = f"lower max_model_len (at most {longest} fits), " if longest >= 2 else ""
        raise UserError(
            f"gpu_memory_utilization={config.gpu_memory_utilization} gives this engine "
            f"{_size(share)} of {device}'s {_size(total_bytes)}; {_size(in_use_bytes)} of it is "
            f"in use already (the weights) and {_size(reserve)} is kept for activations, CUDA "
            f"graphs and step buffers (max_num_batched_tokens={config.max_num_batched_tokens}, "
            f"max_num_seqs={config.max_num_seqs}), which leaves {_size(budget)} for the KV "
            f"cache: less than one request of max_model_len={max_model_len} tokens needs "
            f"({_size((blocks_per_request + SCRATCH_BLOCKS) * bytes_per_block)}). Raise "
            f"gpu_memory_utilization, {shorter}lower max_num_batched_tokens, or give the "
            "cache's size with num_kv_blocks or kv_cache_memory_bytes"
        )
    return num_blocks


# ANCHOR: plan_kv_cache
def plan_kv_cache(
    config: EngineConfig,
    model_config: LlamaConfig,
    dtype: torch.dtype,
    device: torch.device,
    available_bytes: int | None = None,
    total_bytes: int | None = None,
    in_use_bytes: int = 0,
) -> KVCachePlan:
    """Decide max_model_len and the number of KV blocks, or say which setting to change.

    The memory numbers are the device's (`device_memory`): free, total (a GPU's) and
    held by this process already; each None where unknown.
    """
    model_len = model_config.max_position_embeddings
    if config.max_model_len is not None and config.max_model_len > model_len:
        raise UserError(
            f"max_model_len={config.max_model_len} is longer than the model's context "
            f"({model_len} positions); give max_model_len <= {model_len} or leave it unset"
        )
    max_model_len = config.max_model_len or model_len
    config.scheduler_config(max_model_len)  # without chunking, a whole prompt fits a step
    # ANCHOR: kv_heads_per_rank
    # A rank's share of the KV heads (QKVParallelLinear's: split over the ranks, or one
    # replicated head when there are fewer heads than ranks).
    kv_heads = max(1, model_config.num_key_value_heads // config.tensor_parallel_size)
    kv_size = kv_heads * model_config.head_dim
    bytes_per_token = model_config.num_hidden_layers * 2 * kv_size * dtype.itemsize
    bytes_per_block = config.block_size * bytes_per_token
    # ANCHOR_END: kv_heads_per_rank
    # All the blocks max_num_seqs requests of max_model_len tokens can ever hold.
    full_length_blocks = config.max_num_seqs * math.ceil(max_model_len / config.block_size)
    sized_by_utilization = False
    if config.num_kv_blocks is not None:
        num_blocks = config.num_kv_blocks
    elif config.kv_cache_memory_bytes is not None:
        num_blocks = config.kv_cache_memory_bytes // bytes_per_block
    elif device.type == "cuda" and total_bytes is not None:
        leaves = _blocks_gpu_memory_utilization_leaves(
            config,
            model_config,
            dtype,
            device,
            max_model_len,
            bytes_per_block,
            total_bytes,
            in_use_bytes,
        )
        num_blocks = min(leaves, full_length_blocks)
        sized_by_utilization = True
    else:
        num_blocks = full_length_blocks
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
    buffer_bytes = step_buffer_bytes(config, max_model_len)
    if available_bytes is not None and plan.num_bytes + buffer_bytes > available_bytes:
        needed = (
            f"the KV cache ({plan.describe()}) and the step input buffers "
            f"({_size(buffer_bytes)} for max_num_batched_tokens={config.max_num_batched_tokens})"
            f" need {_size(plan.num_bytes + buffer_bytes)}, but only {_size(available_bytes)} "
            f"is free on {device}"
        )
        if sized_by_utilization:  # this engine's share is more than other processes left
            raise UserError(
                f"{needed}: other processes hold the rest. Lower gpu_memory_utilization "
                f"({config.gpu_memory_utilization}), or free the GPU's memory"
            )
        raise UserError(
            f"{needed}; lower max_num_seqs ({config.max_num_seqs}), max_num_batched_tokens "
            f"or max_model_len ({max_model_len}), or give the cache's size with num_kv_blocks "
            "or kv_cache_memory_bytes"
        )
    return plan


# ANCHOR_END: plan_kv_cache
