"""Package checks for the mode enums, the capture-size helpers and the dispatcher's bad input.

The behaviour students re-implement is tested in labs 03 and 05; this file covers
what the labs leave out (parsing names, error messages).
"""

import pytest

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
from mini_vllm.engine.cudagraph_dispatcher import CudagraphDispatcher
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
