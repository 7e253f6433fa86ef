"""One bad request never harms another, and every mistake gets a message that says what to do.

Requests: token ids outside the vocabulary, prompts of the wrong type, seeds and
booleans where numbers belong, tiny temperatures. Calls: `generate` is all or nothing
(nothing it queued survives it), a second thread is refused at once. Configuration:
checked before the model loads or the cache is allocated, each message naming its field.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

import mini_vllm.llm as llm_module
from mini_vllm import LLM, SamplingParams
from mini_vllm.bench.reliability import inject_fault
from mini_vllm.engine.engine_config import EngineConfig
from mini_vllm.engine.kv_cache_plan import CPU_DEFAULT_KV_CACHE_BYTES, plan_kv_cache
from mini_vllm.errors import UserError
from mini_vllm.models.config import get_model_config

GREEDY = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", max_num_seqs=4, max_model_len=64)


def assert_clean(llm):
    assert not llm.engine.has_unfinished_requests()
    assert llm.engine.block_manager.num_used_blocks == 0


# -- bad requests among good ones ----------------------------------------------------


@pytest.mark.parametrize("bad_id", [-1, 260, 10**6, 2**63, 2**70])
def test_a_token_id_outside_the_vocabulary_fails_alone(llm, bad_id):
    good = [[5, 6, 7], [8, 9]]
    alone = [o.token_ids for o in llm.generate(good, GREEDY, use_tqdm=False)]
    outputs = llm.generate([good[0], [1, bad_id, 2], good[1]], GREEDY, use_tqdm=False)
    assert [o.finish_reason for o in outputs] == ["length", "error", "length"]
    assert "vocabulary" in outputs[1].error or ">= 0" in outputs[1].error
    assert [outputs[0].token_ids, outputs[2].token_ids] == alone
    assert_clean(llm)


def test_the_engine_api_refuses_bad_ids_before_queueing_them(llm):
    for bad in ([], [3, 260], [-4], "text", b"\x01\x02", [1.5], [True], 7):
        with pytest.raises(UserError):
            llm.engine.add_request(bad, GREEDY)
    assert_clean(llm)


@pytest.mark.parametrize(
    "prompt", [1.5, b"abc", bytearray(b"ab"), [1.0, 2.0], [[1, 2]], None, {"a": 1}, [True, 3]]
)
def test_a_prompt_of_the_wrong_type_is_refused_before_anything_is_queued(llm, prompt):
    with pytest.raises(UserError, match="prompt"):
        llm.generate([[5, 6, 7], prompt], GREEDY, use_tqdm=False)
    assert_clean(llm)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("seed", 2**63),
        ("seed", -(2**63) - 1),
        ("seed", True),
        ("seed", 1.0),
        ("max_tokens", True),
        ("top_k", True),
        ("temperature", True),
        ("top_p", False),
        ("ignore_eos", 1),
    ],
)
def test_sampling_options_refuse_out_of_range_seeds_and_booleans(option, value):
    with pytest.raises(UserError, match=option):
        SamplingParams(**{option: value})


def test_the_largest_int64_seed_samples(llm):
    for seed in (2**63 - 1, -(2**63)):
        params = SamplingParams(temperature=1.0, seed=seed, max_tokens=3)
        assert llm.generate([[5, 6]], params, use_tqdm=False)[0].ok


@pytest.mark.parametrize("temperature", [1e-38, 1e-300, 5e-324, 1e-6])
def test_a_tiny_temperature_is_greedy(llm, temperature):
    params = SamplingParams(temperature=temperature, max_tokens=6, ignore_eos=True)
    assert params.greedy
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompts = [[5, 6, 7], [40, 41]]
    assert [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == [
        o.token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)
    ]


def test_a_small_temperature_is_raised_to_the_smallest_one_sampled_with(caplog):
    with caplog.at_level(logging.WARNING):
        params = SamplingParams(temperature=1e-3)
    assert params.temperature == 1e-2 and not params.greedy
    assert "1e-2" in caplog.text or "0.01" in caplog.text


# -- generate is all or nothing --------------------------------------------------------


def test_an_interrupted_generate_leaves_nothing_behind(llm):
    prompts = [[5, 6, 7], [8, 9, 10, 11], [12]]
    before = [o.token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    interrupt = inject_fault(llm.engine, "forward", 3, KeyboardInterrupt)
    with interrupt, pytest.raises(KeyboardInterrupt):
        llm.generate(prompts, GREEDY, use_tqdm=False)
    assert_clean(llm)
    assert llm.stats.num_aborted_requests >= 1
    # The next call runs its own requests only, none of the interrupted call's.
    again = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in again] == before
    assert len({o.request_id for o in again}) == 3


def test_a_bad_sampling_params_list_queues_nothing(llm):
    with pytest.raises(UserError, match="SamplingParams"):
        llm.generate([[1], [2]], [GREEDY], use_tqdm=False)
    with pytest.raises(UserError, match=r"sampling_params\[1\]"):
        llm.generate([[1], [2]], [GREEDY, {"temperature": 0}], use_tqdm=False)
    assert_clean(llm)


# -- threads ---------------------------------------------------------------------------


def test_a_second_thread_is_refused_at_once_and_the_first_completes(llm):
    inside, release = threading.Event(), threading.Event()
    original_step = llm.engine.step

    def slow_step():
        inside.set()
        release.wait(10)
        return original_step()

    llm.engine.step = slow_step
    results = {}

    def first():
        results["first"] = llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert inside.wait(10)
        start = time.perf_counter()
        with pytest.raises(UserError, match="one caller at a time"):
            llm.generate([[8, 9]], GREEDY, use_tqdm=False)
        assert time.perf_counter() - start < 1.0  # refused at once, not after waiting
    finally:
        release.set()
        thread.join(10)
        del llm.engine.step
    assert results["first"][0].ok and len(results["first"][0].token_ids) == 5
    assert_clean(llm)


def test_request_ids_stay_unique_when_threads_add_requests():
    llm = LLM("tiny", max_num_seqs=4, max_model_len=64)
    ids, refused = [], []

    def add_many():
        for _ in range(200):
            try:
                ids.append(llm.engine.add_request([1, 2], GREEDY).seq_id)
            except UserError:
                refused.append(1)  # another thread was inside: refused, nothing queued

    threads = [threading.Thread(target=add_many) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ids) == len(set(ids)) and len(ids) + len(refused) == 800
    running, waiting = llm.engine.scheduler.get_request_counts()
    assert running + waiting == len(ids)


# -- configuration, checked before anything is allocated --------------------------------


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if LLM() gets as far as loading weights."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the configuration was checked")

    monkeypatch.setattr(llm_module, "load_model", refuse)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        (dict(max_num_seqs=10**7), "max_num_seqs"),
        # step buffers of 10**12 tokens: refused against free memory, not a MemoryError
        (dict(max_num_seqs=10**9, max_num_batched_tokens=10**12), "max_num_batched_tokens"),
        (dict(gpu_memory_utilization=0), "gpu_memory_utilization"),
        (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
        (dict(max_num_seqs=0), "max_num_seqs"),
        (dict(max_num_seqs=True), "max_num_seqs"),
        (dict(max_num_batched_tokens=2.5), "max_num_batched_tokens"),
        (dict(cpu_threads=0), "cpu_threads"),
        (dict(cpu_threads="many"), "cpu_threads"),
        (dict(cpu_threads=10**6), "cpu_threads"),  # more threads than cores: refused
        (dict(block_size=6), "block_size"),
        (dict(block_size=2**20), "block_size"),  # one block would outweigh a whole cache
        (dict(num_kv_blocks=0), "num_kv_blocks"),
        (dict(max_model_len=1), "max_model_len"),
        (dict(max_model_len=300), "max_model_len"),  # the tiny model has 256 positions
        (dict(num_kv_blocks=4, max_model_len=128), "max_model_len"),  # 64 tokens of cache
        (dict(num_kv_blocks=4, kv_cache_memory_bytes=10**6), "num_kv_blocks"),
        (dict(enable_prefix_caching="yes"), "enable_prefix_caching"),
        (dict(async_scheduling=1), "async_scheduling"),
        (dict(device="gpu"), "device"),
        (dict(dtype="float64"), "dtype"),
        (dict(seed=1.5), "seed"),
        (dict(cudagraph_capture_sizes=[0, 4]), "capture sizes"),
        (dict(enable_chunked_prefill=False, max_num_batched_tokens=64), "max_num_batched_tokens"),
    ],
)
def test_a_bad_configuration_is_refused_before_loading_naming_the_field(no_loading, kwargs, named):
    start = time.perf_counter()
    with pytest.raises(UserError, match=named):
        LLM("tiny", **kwargs)
    assert time.perf_counter() - start < 5


def test_a_cache_too_small_for_one_request_says_what_would_fit(no_loading):
    with pytest.raises(UserError) as info:
        LLM("tiny", block_size=4, num_kv_blocks=10, max_model_len=64)
    message = str(info.value)
    assert "max_model_len <= 40" in message and "num_kv_blocks >= 16" in message


def test_a_cache_larger_than_free_memory_is_refused_before_allocation():
    config = EngineConfig(model="tiny", num_kv_blocks=10**9)
    import torch

    with pytest.raises(UserError, match="free"):
        plan_kv_cache(config, get_model_config("tiny"), torch.float32, torch.device("cpu"), 2**30)


def test_the_default_cpu_kv_cache_is_one_gib_at_most():
    import torch

    config = EngineConfig(model="smollm2-135m-instruct")
    smollm2 = get_model_config("smollm2-135m")
    plan = plan_kv_cache(config, smollm2, torch.float32, torch.device("cpu"))
    assert plan.num_bytes <= CPU_DEFAULT_KV_CACHE_BYTES < 16 * 8192 * 46080  # the old 5.6 GiB
    assert plan.num_tokens >= plan.max_model_len == 8192
    # Without the GPU's memory numbers, a CUDA cache is the full rule, with no cap (with
    # them: what gpu_memory_utilization leaves, tests/engine/test_kv_cache_plan.py).
    on_gpu = plan_kv_cache(config, smollm2, torch.bfloat16, torch.device("cuda"))
    assert on_gpu.num_tokens == 16 * 8192


def test_serve_refuses_a_bad_gpu_memory_utilization_before_listening(capsys):
    pytest.importorskip("fastapi")
    from mini_vllm.__main__ import main

    assert main(["serve", "--port", "0", "--gpu-memory-utilization", "1.5"]) == 2
    assert "gpu_memory_utilization must be a number in (0, 1]" in capsys.readouterr().err


def test_serve_flags_leave_the_batch_limits_to_the_engine():
    import argparse

    from mini_vllm.cli.serve import add_engine_options, engine_argv, engine_kwargs

    parser = argparse.ArgumentParser()
    add_engine_options(parser)
    defaults = parser.parse_args([])
    kwargs = engine_kwargs(defaults)
    assert "max_num_seqs" not in kwargs and "max_num_batched_tokens" not in kwargs
    assert kwargs["gpu_memory_utilization"] == 0.9
    assert "--gpu-memory-utilization" not in engine_argv(defaults)
    half = parser.parse_args(["--gpu-memory-utilization", "0.5"])
    assert engine_kwargs(half)["gpu_memory_utilization"] == 0.5
    words = engine_argv(half)
    assert words[words.index("--gpu-memory-utilization") + 1] == "0.5"
