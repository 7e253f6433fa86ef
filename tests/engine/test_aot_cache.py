"""The saved compiled model (mini_vllm/compilation/caching/aot_cache.py): a restart loads it instead
of tracing, generates what eager generates, and anything wrong with the file, or with the
code it was compiled from, means compiling again, never a wrong or failed start.

Every engine here keeps its compile record and saved model in a scratch MINI_VLLM_CACHE
of this module; Inductor's cache stays where it was, so a compile here is a warm one.
"""

from __future__ import annotations

import inspect
import logging
from collections import Counter

import pytest
import torch

from mini_vllm import LLM, SamplingParams
from mini_vllm.compilation.caching import aot_cache
from mini_vllm.compilation.passes.fusion import op_name

pytestmark = pytest.mark.skipif(
    not aot_cache.aot_compile_supported(),
    reason=f"torch {torch.__version__} cannot save a compiled function (AOT compile: 2.10 on)",
)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
PROMPTS = [[5, 17, 42], [7, 7, 7, 7, 7, 9, 100, 3], [250]]


@pytest.fixture(scope="module")
def scratch_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("aot-cache")


@pytest.fixture
def aot_env(scratch_cache, monkeypatch):
    from mini_vllm.compilation.caching.compile_cache import inductor_cache_dir

    # Inductor's cache stays the usual one (warm); only the record and the model move.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", inductor_cache_dir())
    monkeypatch.setenv("MINI_VLLM_CACHE", str(scratch_cache))
    monkeypatch.delenv("MINI_VLLM_COMPILE_CACHE", raising=False)
    return scratch_cache


def start(device: str, compiled: bool = True) -> tuple[LLM, list[list[int]]]:
    llm = LLM(
        "tiny",
        device=device,
        dtype="float32",
        max_num_seqs=4,
        max_model_len=64,
        compilation_mode="vllm_compile" if compiled else "none",
        cudagraph_mode="full_and_piecewise" if device == "cuda" else "none",
        cudagraph_capture_sizes=[1, 2, 4],
    )
    return llm, [o.token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def saved_path(llm: LLM):
    return llm.engine.runner.graphs.compiler.artifact_path


@pytest.mark.parametrize("device", DEVICES)
def test_a_restart_loads_the_saved_model_and_generates_what_eager_generates(aot_env, device):
    first, first_tokens = start(device)
    report = first.engine.runner.compile_report
    path = saved_path(first)
    assert path.exists() and path.parent.parent == aot_env
    if not report.loaded:  # an earlier test on this worker may have saved it already
        assert report.dynamo_graphs == 1 and f"saved to {path}" in report.line()

    second, second_tokens = start(device)
    report = second.engine.runner.compile_report
    layers = second.engine.model.config.num_hidden_layers
    assert report.loaded and report.dynamo_graphs == 0, report.line()
    assert report.compiled_pieces == layers + 1
    assert "no Dynamo trace" in report.line() and str(path) in report.line()
    graphs = second.engine.runner.graphs
    if device == "cuda":
        assert len(graphs.piece_wrappers) == layers + 1  # installed in their graph wrappers
    assert sum(item.is_splitting_graph for item in graphs.split_items) == layers
    # The traced graph came back with the model (diagnostics and the fusion tests read it).
    traced_ops = Counter(map(op_name, graphs.compile_stats.graph.graph.nodes))
    assert traced_ops["mini_vllm::attention"] + traced_ops["mini_vllm::attention_with_rope"] == (
        layers
    )
    assert first_tokens == second_tokens == start(device, compiled=False)[1]


def test_a_damaged_file_is_compiled_again_and_replaced(aot_env, caplog):
    first, tokens = start("cpu")
    path = saved_path(first)
    path.write_bytes(b"not a compiled model")
    with caplog.at_level(logging.WARNING, logger="mini_vllm.compilation.caching.aot_cache"):
        again, again_tokens = start("cpu")
    report = again.engine.runner.compile_report
    assert not report.loaded and report.dynamo_graphs == 1
    assert any("could not load the compiled model" in r.getMessage() for r in caplog.records)
    assert again_tokens == tokens
    assert start("cpu")[0].engine.runner.compile_report.loaded  # the file was written again


def test_a_change_in_the_traced_source_is_compiled_again(aot_env, monkeypatch):
    start("cpu")  # make sure a saved model exists
    real_getsource = inspect.getsource

    def edited(obj):
        source = real_getsource(obj)
        return source + "\n# edited\n" if obj.__name__ == "mini_vllm.models.llama" else source

    monkeypatch.setattr(aot_cache.inspect, "getsource", edited)
    llm, _ = start("cpu")
    report = llm.engine.runner.compile_report
    assert not report.loaded and report.dynamo_graphs == 1


def test_the_saved_model_can_be_turned_off(aot_env, monkeypatch):
    start("cpu")
    monkeypatch.setenv("MINI_VLLM_COMPILE_CACHE", "0")
    llm, _ = start("cpu")
    report = llm.engine.runner.compile_report
    assert not report.loaded and report.dynamo_graphs == 1 and report.artifact is None
    monkeypatch.setenv("MINI_VLLM_COMPILE_CACHE", "maybe")
    with pytest.raises(Exception, match="MINI_VLLM_COMPILE_CACHE='maybe' is not understood"):
        aot_cache.aot_compile_supported()
