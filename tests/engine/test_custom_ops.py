"""The kernel table and its switch (mini_vllm/_custom_ops.py): the engine runs on plain torch
with the kernels off or missing, and gives the same tokens as with them."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from mini_vllm import LLM, SamplingParams
from mini_vllm import _custom_ops as ops
from mini_vllm.attention.paged import PagedAttentionBackend
from mini_vllm.engine.engine_config import EngineConfig
from mini_vllm.errors import UserError
from mini_vllm.layers.custom_op import CustomOp

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [11, 12, 13, 14, 15, 16, 17]]


def custom_op_layers(llm):
    return [m for m in llm.engine.runner.model.modules() if isinstance(m, CustomOp)]


def tokens(llm):
    return [out.token_ids for out in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("all", set(ops.CUSTOM_OPS)),
        ("none", set()),
        ("none,+rms_norm", {"rms_norm"}),
        (["-linear", "-paged_attention"], set(ops.CUSTOM_OPS) - {"linear", "paged_attention"}),
        ("+rms_norm, -rms_norm", set(ops.CUSTOM_OPS) - {"rms_norm"}),  # in order, last wins
    ],
)
def test_the_switch_reads_as_vllms_custom_ops(spec, expected):
    assert ops.parse_custom_ops(spec) == expected


@pytest.mark.parametrize("spec", ["gemv", "+gemv", "rms_norm", ["none", 3], 5])
def test_a_wrong_switch_names_the_ops_there_are(spec):
    with pytest.raises(UserError, match="custom_ops") as error:
        ops.parse_custom_ops(spec)
    if isinstance(spec, str):
        assert "paged_attention" in str(error.value)  # the message lists the names


def test_the_environment_variable_is_the_default_and_checked(monkeypatch):
    monkeypatch.setenv("MINI_VLLM_CUSTOM_OPS", "none,+linear")
    assert EngineConfig(model="tiny").custom_ops == {"linear"}
    assert EngineConfig(model="tiny", custom_ops="all").custom_ops == set(ops.CUSTOM_OPS)
    monkeypatch.setenv("MINI_VLLM_CUSTOM_OPS", "fast")
    with pytest.raises(UserError, match="MINI_VLLM_CUSTOM_OPS: 'fast' is not understood"):
        EngineConfig(model="tiny")


def test_fusion_asked_for_without_the_product_kernels_is_refused():
    with pytest.raises(UserError, match="add '\\+linear' to custom_ops"):
        EngineConfig(
            model="tiny",
            compilation_mode="vllm_compile",
            enable_fusion=True,
            custom_ops="-linear",
        )


def test_none_runs_every_layer_natively_and_gives_the_same_tokens():
    with_kernels = LLM("tiny", custom_ops="all", max_num_seqs=4)
    without = LLM("tiny", custom_ops="none", max_num_seqs=4)
    assert all(layer.use_kernels for layer in custom_op_layers(with_kernels))
    assert not any(layer.use_kernels for layer in custom_op_layers(without))
    # The plain layout: no layer keeps its weight column-major for the CPU's split products.
    assert all(p.is_contiguous() for p in without.engine.runner.model.parameters() if p.dim() == 2)
    assert type(without.engine.runner.attn_backend) is PagedAttentionBackend
    assert tokens(without) == tokens(with_kernels)


def test_one_op_off_leaves_the_others_on():
    llm = LLM("tiny", custom_ops="-rms_norm", max_num_seqs=4)
    on = {type(layer).__name__: layer.use_kernels for layer in custom_op_layers(llm)}
    assert on["RMSNorm"] is False and on["RowParallelLinear"] and on["RotaryEmbedding"]


def test_an_engine_sets_the_switch_on_a_model_built_for_another():
    built = LLM("tiny", custom_ops="all", max_num_seqs=4)
    reference = tokens(built)
    model = built.engine.runner.model
    del built
    again = LLM.from_model(model, custom_ops="none", max_num_seqs=4)
    assert not any(layer.use_kernels for layer in custom_op_layers(again))
    assert tokens(again) == reference


def test_the_engine_imports_and_generates_with_the_kernels_missing():
    """With mini_vllm/kernels/ unimportable, the reading path runs alone, says why once,
    and gives the tokens the kernels give."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["mini_vllm.kernels"] = None  # `import mini_vllm.kernels` now fails
        from mini_vllm import LLM, SamplingParams
        llm = LLM("tiny", max_num_seqs=4)
        params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
        outs = llm.generate({PROMPTS!r}, params, use_tqdm=False)
        print([o.token_ids for o in outs])
        print(sorted(type(m).__name__ for m in llm.engine.runner.model.modules()
                     if getattr(m, "use_kernels", False)))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed_tokens, layers_on_kernels = proc.stdout.strip().splitlines()[-2:]
    assert layers_on_kernels == "[]"
    assert "mini_vllm.kernels cannot be imported" in proc.stderr
    assert printed_tokens == str(tokens(LLM("tiny", max_num_seqs=4)))


def test_the_reading_path_does_not_load_the_kernels_when_they_are_off():
    script = textwrap.dedent(
        """
        import sys
        from mini_vllm import LLM, SamplingParams
        llm = LLM("tiny", custom_ops="none", max_num_seqs=4)
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=3), use_tqdm=False)
        print(sorted(m for m in sys.modules if m.startswith(("mini_vllm.kernels", "triton"))))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_two_engines_in_one_process_keep_their_own_setting():
    import threading

    built = {}

    def build(spec):
        built[spec] = LLM("tiny", custom_ops=spec, max_num_seqs=4)

    threads = [threading.Thread(target=build, args=(spec,)) for spec in ("all", "none")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(layer.use_kernels for layer in custom_op_layers(built["all"]))
    assert not any(layer.use_kernels for layer in custom_op_layers(built["none"]))
