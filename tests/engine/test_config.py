"""Package checks for the engine's defaults by device, the mode enums, the capture-size
helpers and the dispatcher's bad input.

The behaviour students re-implement is tested in labs 03 and 05; this file covers
what the labs leave out (defaults, parsing names, error messages). The GPU defaults are
checked on any machine: the GPU's memory reading is replaced by a fake one.
"""

import pytest
import torch

from mini_vllm.config.capture_sizes import (
    default_capture_sizes,
    normalize_capture_sizes,
    padded_size,
)
from mini_vllm.config.compilation import (
    AttentionCGSupport,
    CompilationMode,
    CUDAGraphMode,
    resolve_cudagraph_mode,
)
from mini_vllm.engine import engine_config
from mini_vllm.engine.cudagraph_dispatcher import CudagraphDispatcher
from mini_vllm.engine.engine_config import EngineConfig
from mini_vllm.errors import UserError
from mini_vllm.forward_context import BatchDescriptor, get_forward_context, set_forward_context


@pytest.mark.parametrize(
    "text, member",
    [
        ("full_and_piecewise", "FULL_AND_PIECEWISE"),
        ("FULL-DECODE-ONLY", "FULL_DECODE_ONLY"),
        (" none ", "NONE"),
    ],
)
def test_cudagraph_mode_parses_names_in_any_case(text, member):
    assert CUDAGraphMode.from_name(text) is CUDAGraphMode[member]


def test_unknown_cudagraph_mode_lists_the_allowed_names():
    with pytest.raises(ValueError, match="FULL_AND_PIECEWISE") as info:
        CUDAGraphMode.from_name("full_graphs")
    assert "full_graphs" in str(info.value)


def test_compilation_mode_parses_names_and_levels():
    assert CompilationMode.from_name("vllm_compile") is CompilationMode.VLLM_COMPILE
    assert CompilationMode.from_name(2) is CompilationMode.DYNAMO_TRACE_ONCE
    assert [int(m) for m in CompilationMode] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="STOCK_TORCH_COMPILE"):
        CompilationMode.from_name(7)


def test_attention_support_is_ordered():
    assert (
        AttentionCGSupport.NEVER
        < AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
        < AttentionCGSupport.UNIFORM_BATCH
        < AttentionCGSupport.ALWAYS
    )
    assert int(AttentionCGSupport.ALWAYS) == 3


def test_resolve_accepts_mode_names_and_rejects_bad_query_len():
    assert (
        resolve_cudagraph_mode("full_and_piecewise", AttentionCGSupport.ALWAYS, True)
        is CUDAGraphMode.FULL_AND_PIECEWISE
    )
    with pytest.raises(ValueError, match="uniform_decode_query_len"):
        resolve_cudagraph_mode("full", AttentionCGSupport.ALWAYS, True, uniform_decode_query_len=0)


def test_non_positive_limits_are_rejected_with_the_values():
    with pytest.raises(ValueError, match="max_num_seqs"):
        default_capture_sizes(0, 8192)
    with pytest.raises(ValueError, match="at least one token"):
        padded_size(0, [1, 2, 4])


def test_user_ladder_entirely_over_budget_says_so():
    with pytest.raises(ValueError, match="max_num_batched_tokens=16"):
        normalize_capture_sizes([32, 64], max_num_batched_tokens=16)


def test_dispatcher_rejects_non_positive_capture_sizes():
    with pytest.raises(ValueError, match="positive"):
        CudagraphDispatcher("full", [0, 8], max_num_seqs=4)


def test_dispatcher_lists_keys_largest_first():
    keys = CudagraphDispatcher("full_and_piecewise", [1, 2, 4], max_num_seqs=4).all_keys()
    assert [(m.name, k.num_tokens) for m, k in keys] == [
        ("PIECEWISE", 4),
        ("PIECEWISE", 2),
        ("PIECEWISE", 1),
        ("FULL", 4),
        ("FULL", 2),
        ("FULL", 1),
    ]


def test_batch_descriptor_is_a_hashable_key():
    graphs = {BatchDescriptor(8): "relaxed", BatchDescriptor(8, 8, True): "uniform"}
    assert (
        graphs[BatchDescriptor(8, 8, uniform=True).relax_for_mixed_batch_cudagraphs()] == "relaxed"
    )


def test_forward_context_nests_and_is_required():
    with pytest.raises(RuntimeError, match="no forward context"):
        get_forward_context()
    with set_forward_context(CUDAGraphMode.FULL, BatchDescriptor(4)):
        with set_forward_context(CUDAGraphMode.NONE):
            assert get_forward_context().cudagraph_runtime_mode is CUDAGraphMode.NONE
        assert get_forward_context().batch_descriptor == BatchDescriptor(4)


# -- max_num_seqs / max_num_batched_tokens left unset: the device's defaults -------------

H100 = (80, "NVIDIA H100 80GB HBM3")
A100 = (80, "NVIDIA A100-SXM4-80GB")
L4 = (24, "NVIDIA L4")


@pytest.fixture
def fake_gpu(monkeypatch):
    """Make `cuda` a device here, a GPU of `gib` GiB named `name`."""

    def install(gib: int, name: str) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(
            engine_config, "gpu_memory_and_name", lambda device: (gib * 2**30, name)
        )

    return install


@pytest.mark.parametrize("usage_context", ["llm_class", "openai_api_server"])
def test_cpu_defaults_stay_laptop_sized(usage_context):
    config = EngineConfig(model="tiny", usage_context=usage_context)
    assert (config.max_num_seqs, config.max_num_batched_tokens) == (16, 2048)


@pytest.mark.parametrize(
    ("gpu", "usage_context", "expected"),
    [
        (H100, "llm_class", (1024, 16384)),
        (H100, "openai_api_server", (1024, 8192)),
        (L4, "llm_class", (256, 8192)),
        (L4, "openai_api_server", (256, 2048)),
        (A100, "llm_class", (256, 8192)),  # 80 GiB, but vLLM keeps A100s on the small row
    ],
)
def test_gpu_defaults_are_vllms_by_memory_and_entry_point(fake_gpu, gpu, usage_context, expected):
    fake_gpu(*gpu)
    config = EngineConfig(model="tiny", device="cuda", usage_context=usage_context)
    assert (config.max_num_seqs, config.max_num_batched_tokens) == expected
    assert type(config.max_num_seqs) is int and type(config.max_num_batched_tokens) is int
    assert config.scheduler_config(256).max_num_seqs == expected[0]


def test_gpu_defaults_shrink_to_what_the_given_limits_allow(fake_gpu):
    fake_gpu(*H100)
    # A step never holds more than max_num_seqs requests of max_model_len tokens.
    few = EngineConfig(model="tiny", device="cuda", max_num_seqs=4, max_model_len=128)
    assert (few.max_num_seqs, few.max_num_batched_tokens) == (4, 512)
    # A decode step needs a token for each request.
    small_budget = EngineConfig(model="tiny", device="cuda", max_num_batched_tokens=100)
    assert small_budget.max_num_seqs == 100


def test_gpu_default_budget_grows_to_a_whole_prompt_without_chunked_prefill(fake_gpu):
    fake_gpu(*L4)
    config = EngineConfig(
        model="smollm2-135m",
        device="cuda",
        usage_context="openai_api_server",
        enable_chunked_prefill=False,
        max_model_len=4096,
    )
    assert (config.max_num_seqs, config.max_num_batched_tokens) == (256, 4096)


def test_explicit_batch_limits_are_kept_on_every_device(fake_gpu):
    fake_gpu(*H100)
    for device in ("cpu", "cuda"):
        config = EngineConfig(
            model="tiny", device=device, max_num_seqs=3, max_num_batched_tokens=2000
        )
        assert (config.max_num_seqs, config.max_num_batched_tokens) == (3, 2000)


@pytest.mark.parametrize("value", [0, 1.5, -0.1, "x", "0.9", True, None, float("nan")])
def test_gpu_memory_utilization_outside_zero_to_one_is_refused(value):
    with pytest.raises(UserError, match=r"gpu_memory_utilization must be a number in \(0, 1\]"):
        EngineConfig(model="tiny", gpu_memory_utilization=value)


@pytest.mark.parametrize("value", [0.05, 0.9, 1, 1.0])
def test_gpu_memory_utilization_takes_any_fraction_up_to_one(value):
    assert EngineConfig(model="tiny", gpu_memory_utilization=value).gpu_memory_utilization == value


def test_an_unknown_usage_context_lists_the_known_ones():
    with pytest.raises(UserError, match="llm_class, openai_api_server"):
        EngineConfig(model="tiny", usage_context="server")
