"""The KV cache's default size on CUDA: what gpu_memory_utilization leaves, capped at what
max_num_seqs full-length requests can use (mini_vllm/engine/kv_cache_plan.py).

Every test runs on any machine: the GPU's memory numbers are given to plan_kv_cache as
arguments, and the engine config's GPU reading is replaced by a fake 80 GiB H100.
"""

from __future__ import annotations

import math

import pytest
import torch

from mini_vllm.engine import engine_config
from mini_vllm.engine.engine_config import EngineConfig
from mini_vllm.engine.kv_cache_plan import (
    device_memory,
    forward_reserve_bytes,
    plan_kv_cache,
    step_buffer_bytes,
)
from mini_vllm.errors import UserError
from mini_vllm.models.config import get_model_config

GiB = 2**30
CUDA = torch.device("cuda")
SMOLLM2 = get_model_config("smollm2-135m")  # 8192 positions, 23,040 bytes of bf16 KV a token
BYTES_PER_BLOCK = 16 * SMOLLM2.num_hidden_layers * 2 * SMOLLM2.kv_size * 2


@pytest.fixture
def cuda_config(monkeypatch):
    """EngineConfig(device="cuda", ...) as on an 80 GiB H100."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        engine_config, "gpu_memory_and_name", lambda device: (80 * GiB, "NVIDIA H100 80GB HBM3")
    )

    def make(**kwargs) -> EngineConfig:
        return EngineConfig(model="smollm2-135m", device="cuda", **kwargs)

    return make


def plan_on_gpu(config, total=80 * GiB, in_use=GiB, free=None):
    free = total - in_use if free is None else free
    return plan_kv_cache(
        config,
        SMOLLM2,
        torch.bfloat16,
        CUDA,
        available_bytes=free,
        total_bytes=total,
        in_use_bytes=in_use,
    )


def test_the_cache_takes_the_share_less_weights_and_forward_reserve(cuda_config):
    config = cuda_config()  # 1024 requests of 8192 tokens would need 193 GB: the budget rules
    plan = plan_on_gpu(config, in_use=GiB)
    reserve = forward_reserve_bytes(config, SMOLLM2, torch.bfloat16, 8192)
    budget = int(0.9 * 80 * GiB) - GiB - reserve
    assert plan.num_blocks == budget // BYTES_PER_BLOCK - 1  # one scratch block a layer
    assert plan.num_bytes <= budget < plan.num_bytes + 2 * BYTES_PER_BLOCK
    half = plan_on_gpu(cuda_config(gpu_memory_utilization=0.45), in_use=GiB)
    assert half.num_bytes == pytest.approx(plan.num_bytes - 0.45 * 80 * GiB, abs=BYTES_PER_BLOCK)


def test_the_forward_reserve_holds_the_step_buffers_and_grows_with_the_step_budget(cuda_config):
    small, large = cuda_config(max_num_batched_tokens=2048), cuda_config()
    small_reserve = forward_reserve_bytes(small, SMOLLM2, torch.bfloat16, 8192)
    assert small_reserve > step_buffer_bytes(small, 8192) + 2 * GiB  # + the fixed reserve
    assert forward_reserve_bytes(large, SMOLLM2, torch.bfloat16, 8192) > small_reserve


def test_the_cache_is_capped_at_what_max_num_seqs_full_requests_can_use(cuda_config):
    plan = plan_on_gpu(cuda_config(max_num_seqs=4, max_model_len=128))
    assert plan.num_blocks == 4 * 128 // 16
    unset_length = plan_on_gpu(cuda_config(max_num_seqs=2))  # the model's 8192 positions
    assert unset_length.num_blocks == 2 * 8192 // 16


def test_a_budget_short_of_one_request_says_to_raise_gpu_memory_utilization(cuda_config):
    config = cuda_config(gpu_memory_utilization=0.1)
    with pytest.raises(UserError) as info:
        plan_on_gpu(config, total=8 * GiB, in_use=GiB // 2)
    message = str(info.value)
    assert "gpu_memory_utilization=0.1" in message and "Raise gpu_memory_utilization" in message
    assert "max_model_len=8192" in message and "num_kv_blocks" in message


def test_a_budget_short_of_one_request_says_how_long_a_request_fits(cuda_config):
    config = cuda_config(max_num_batched_tokens=2048, max_num_seqs=16)
    reserve = forward_reserve_bytes(config, SMOLLM2, torch.bfloat16, 8192)
    blocks = 100  # what the budget holds, scratch block included
    total = math.ceil((GiB + reserve + blocks * BYTES_PER_BLOCK) / 0.9)
    with pytest.raises(UserError, match=r"lower max_model_len \(at most 1584 fits\)"):
        plan_on_gpu(config, total=total, in_use=GiB)


def test_an_explicit_size_wins_over_gpu_memory_utilization(cuda_config):
    tight = dict(total=8 * GiB, in_use=GiB // 2)  # 0.1 of it cannot hold one request
    blocks = plan_on_gpu(cuda_config(gpu_memory_utilization=0.1, num_kv_blocks=600), **tight)
    assert blocks.num_blocks == 600
    in_bytes = cuda_config(gpu_memory_utilization=0.1, kv_cache_memory_bytes=600 * BYTES_PER_BLOCK)
    assert plan_on_gpu(in_bytes, **tight).num_blocks == 600


def test_a_share_larger_than_free_memory_blames_other_processes(cuda_config):
    with pytest.raises(UserError, match="other processes hold the rest. Lower gpu_memory"):
        plan_on_gpu(cuda_config(), total=80 * GiB, in_use=GiB, free=10 * GiB)


def test_huge_batch_limits_are_refused_before_allocation(cuda_config):
    config = cuda_config(max_num_seqs=10**9, max_num_batched_tokens=10**12)
    with pytest.raises(UserError, match="lower max_num_batched_tokens"):
        plan_on_gpu(config)


def test_without_gpu_numbers_a_cuda_cache_is_the_full_length_rule(cuda_config):
    plan = plan_kv_cache(cuda_config(max_num_seqs=3), SMOLLM2, torch.bfloat16, CUDA)
    assert plan.num_blocks == 3 * 8192 // 16


def test_cpu_memory_reading_has_no_gpu_numbers():
    memory = device_memory(torch.device("cpu"))
    assert memory["total_bytes"] is None and memory["in_use_bytes"] == 0


def test_step_buffer_bytes_is_what_the_runner_allocates():
    from mini_vllm import LLM

    llm = LLM("tiny", max_num_seqs=4, max_num_batched_tokens=64, max_model_len=128)
    engine = llm.engine
    assert step_buffer_bytes(engine.config, engine.max_model_len) == engine.runner._ints.nbytes
