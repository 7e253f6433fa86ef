"""torch.compile in mini_vllm: the compilation levels, the split at attention, no recompiles,
the opaque attention op, diagnostics and the compile cache.

Tolerance: Inductor fuses and reorders floating-point operations (a norm's sum, a fused
multiply-add), so compiled float32 outputs differ from eager by rounding: 1e-5
relative on hidden states here; greedy tokens agree.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mini_vllm import LLM, SamplingParams
from mini_vllm.compilation.caching import aot_cache
from mini_vllm.config.compilation import CUDAGraphMode

ROOT = Path(__file__).resolve().parents[2]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def prompts(n=6, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(rng.randint(2, 20))] for _ in range(n)]


def make(device, **kw):
    kw.setdefault("max_num_seqs", 4)
    kw.setdefault("max_model_len", 64)
    kw.setdefault("cudagraph_capture_sizes", [1, 2, 4])
    return LLM("tiny", device=device, dtype="float32", **kw)


@pytest.fixture(scope="module", params=DEVICES)
def eager_tokens(request):
    return request.param, [
        o.token_ids for o in make(request.param).generate(prompts(), GREEDY, use_tqdm=False)
    ]


@pytest.mark.parametrize(
    "level, graphs",
    [
        ("stock_torch_compile", "none"),
        ("dynamo_trace_once", "full_decode_only"),
        ("vllm_compile", "none"),
        ("vllm_compile", "piecewise"),
        ("vllm_compile", "full_and_piecewise"),
    ],
)
def test_compiled_generation_equals_eager(eager_tokens, level, graphs):
    device, expected = eager_tokens
    llm = make(device, compilation_mode=level, cudagraph_mode=graphs)
    outputs = llm.generate(prompts(), GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outputs] == expected
    runner = llm.engine.runner
    assert runner.compile_report is not None and runner.compile_report.mode == level.upper()
    if graphs != "none":
        assert llm.stats.decode_graph_hit_rate > 0.5


def test_stock_compile_does_recompile_where_trace_once_does_not():
    # Every LlamaModel shares one forward code object, and Dynamo keeps its compiled
    # entries per code object; it also saves which sizes it saw change (profile-guided
    # automatic dynamic, on disk) and marks them dynamic in the next compile of that code.
    # Either would let this model reuse what an earlier stock engine learned, and nothing
    # would recompile. Start from a fresh process's state with no saved profile. (Kept
    # before the module-scoped compiled engine below is built, so the reset cannot touch it.)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(automatic_dynamic_local_pgo=False):
        stock = make("cpu", compilation_mode="stock_torch_compile", cudagraph_mode="none")
        # One request: a prefill of several tokens, then decode steps of one token each.
        stock.generate(prompts(1), GREEDY, use_tqdm=False)
    # Dynamo specialises sizes 0 and 1 even for a dimension marked dynamic, so the first
    # one-token decode fails the guard `2 <= input_ids.size(0)` and compiles again.
    assert stock.engine.runner.graphs.compiler.num_recompiles >= 1


@pytest.fixture(scope="module")
def compiled_llm():
    # Traced and compiled in this process (not loaded from an earlier run's saved model):
    # these tests are about what Dynamo does.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MINI_VLLM_COMPILE_CACHE", "0")
        llm = make("cpu", compilation_mode="vllm_compile", cudagraph_mode="full_and_piecewise")
    # Requests of different lengths: decode batches shrink from 4 rows to 1 as they finish.
    params = [
        SamplingParams(temperature=0, max_tokens=3 + 2 * i, ignore_eos=True) for i in range(8)
    ]
    llm.generate(prompts(8, seed=5), params, use_tqdm=False)
    return llm


def test_hidden_states_match_eager_within_float32_rounding(compiled_llm):
    from mini_vllm.attention.paged import PagedAttentionMetadata
    from mini_vllm.compilation.attention_op import use_attention_op
    from mini_vllm.forward_context import set_forward_context
    from mini_vllm.layers.attention import static_forward_context

    model = compiled_llm.engine.model
    ids, pos = torch.randint(0, 256, (5,)), torch.arange(5)
    md = PagedAttentionMetadata(
        torch.tensor([0, 1, 2, 3, 4]), torch.tensor([[0, 1]]), torch.tensor([5]), [5], [5], False
    )
    layers = static_forward_context(model)
    with torch.inference_mode(), set_forward_context(CUDAGraphMode.NONE, None, md, layers):
        compiled = model.model(ids, pos).clone()
        wrapper = model.model.__dict__.pop("_compile_wrapper")
        use_attention_op(model, enabled=False)
        try:
            eager = model.model(ids, pos)
        finally:
            model.model.__dict__["_compile_wrapper"] = wrapper
            use_attention_op(model)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


def test_split_gives_layers_plus_one_compiled_pieces(compiled_llm):
    graphs = compiled_llm.engine.runner.graphs
    layers = compiled_llm.engine.model.config.num_hidden_layers
    assert graphs.compile_stats.compiled_pieces == layers + 1
    assert sum(1 for item in graphs.split_items if item.is_splitting_graph) == layers
    assert len(graphs.piece_wrappers) == layers + 1


def test_no_recompile_across_decode_steps_and_batch_sizes(compiled_llm):
    # The run above went through prefills of many sizes and decode batches of 1 to 4.
    sizes = {s.num_reqs for s in compiled_llm.stats.steps if s.uniform_decode}
    assert len(sizes) >= 2
    assert compiled_llm.engine.runner.graphs.compiler.num_recompiles == 0
    assert compiled_llm.engine.runner.graphs.compile_stats.dynamo_graphs == 1


def test_attention_is_one_opaque_node_in_the_traced_graph(compiled_llm):
    graph = compiled_llm.engine.runner.graphs.compile_stats.graph.graph
    targets = [str(n.target) for n in graph.nodes if n.op == "call_function"]
    attention = [t for t in targets if "mini_vllm.attention" in t]
    assert len(attention) == compiled_llm.engine.model.config.num_hidden_layers
    # Nothing of attention's own work leaks into the graph Dynamo traced.
    assert not [t for t in targets if "scaled_dot_product" in t or "index_copy" in t]


def test_diagnostics_report_a_graph_break_introduced_on_purpose():
    from mini_vllm.compilation.diagnostics import explain_graph_breaks, fullgraph_ok

    def clean(x):
        return torch.relu(x) * 2

    def broken(x):
        y = torch.relu(x)
        torch._dynamo.graph_break()  # the break, on purpose
        return y * 2

    x = torch.randn(4)
    assert explain_graph_breaks(clean, x).graph_break_count == 0
    report = explain_graph_breaks(broken, x)
    assert report.graph_break_count == 1 and report.graph_count == 2 and report.reasons
    assert fullgraph_ok(clean, x)[0] and not fullgraph_ok(broken, x)[0]


def test_the_model_traces_in_one_graph():
    from mini_vllm.attention.paged import (
        PagedAttentionBackend,
        PagedAttentionMetadata,
        allocate_paged_kv_caches,
    )
    from mini_vllm.compilation.attention_op import use_attention_op
    from mini_vllm.compilation.diagnostics import explain_graph_breaks
    from mini_vllm.forward_context import set_forward_context
    from mini_vllm.layers.attention import bind_kv_caches, static_forward_context
    from mini_vllm.models.loader import load_model

    model, _, cfg = load_model("tiny")
    bind_kv_caches(
        model,
        PagedAttentionBackend(),
        allocate_paged_kv_caches(
            cfg.num_hidden_layers,
            4,
            16,
            cfg.num_key_value_heads,
            cfg.head_dim,
            torch.float32,
            "cpu",
        ),
    )
    use_attention_op(model)
    forward = type(model.model).forward  # the undecorated forward, traced as Dynamo would
    md = PagedAttentionMetadata(
        torch.tensor([0, 1, 2]), torch.tensor([[0]]), torch.tensor([3]), [3], [3], False
    )
    with (
        torch.inference_mode(),
        set_forward_context(CUDAGraphMode.NONE, None, md, static_forward_context(model)),
    ):
        report = explain_graph_breaks(
            lambda i, p: forward(model.model, i, p),
            torch.zeros(3, dtype=torch.long),
            torch.arange(3),
        )
    assert report.graph_break_count == 0, report.format()


def test_second_start_compiles_faster_from_the_cache(tmp_path):
    script = (
        "from mini_vllm import LLM\nllm = LLM('tiny', max_num_seqs=2, "
        "max_model_len=32, compilation_mode='vllm_compile', "
        "cudagraph_mode='none')\nprint('SECONDS', llm.engine.runner.compile_report.seconds)\n"
    )
    env = dict(os.environ, MINI_VLLM_CACHE=str(tmp_path / "cache"), TORCHINDUCTOR_CACHE_DIR="")
    env.pop("TORCHINDUCTOR_CACHE_DIR")

    def start() -> tuple[float, str]:
        out = subprocess.run(
            [sys.executable, "-c", script],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        seconds = float(
            next(line.split()[1] for line in out.stdout.splitlines() if line.startswith("SECONDS"))
        )
        return seconds, out.stdout

    cold, cold_out = start()
    warm, warm_out = start()
    assert "first start: cold cache" in cold_out and "previous start" in warm_out
    assert warm < cold
    if aot_cache.aot_compile_supported():  # the restart loaded the model the first start saved
        assert "saved to" in cold_out and "no Dynamo trace" in warm_out, warm_out
    assert (tmp_path / "cache" / "inductor").is_dir() and list(
        (tmp_path / "cache" / "compile").glob("*.json")
    )


def test_an_engine_without_compilation_runs_a_model_another_engine_compiled_as_written():
    # Benchmarks build one engine per mode on one shared model; a compiled mode must not
    # leave its compiled forward behind for the eager modes after it.
    from mini_vllm.engine.engine_config import EngineConfig
    from mini_vllm.engine.llm_engine import LLMEngine

    compiled = make("cpu", compilation_mode="vllm_compile", cudagraph_mode="none")
    expected = [o.token_ids for o in compiled.generate(prompts(2), GREEDY, use_tqdm=False)]
    model = compiled.engine.model
    assert "_compile_wrapper" in model.model.__dict__
    eager = LLMEngine(
        EngineConfig(
            model="(shared)", device="cpu", dtype="float32", max_num_seqs=4, max_model_len=64
        ),
        model,
        capture_progress=False,
    )
    assert "_compile_wrapper" not in model.model.__dict__
    assert not any(getattr(m, "use_custom_op", False) for m in model.modules())
    seqs = [eager.add_request(prompt, GREEDY) for prompt in prompts(2)]
    while eager.has_unfinished_requests():
        eager.step()
    assert [list(seq.output_token_ids) for seq in seqs] == expected
