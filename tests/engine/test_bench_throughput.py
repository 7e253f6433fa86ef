"""`bench throughput`: vLLM's random dataset, the nano-vllm preset, the options' checks, a run
on the tiny model, and scripts/gpu/throughput_workload.py on CPU."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mini_vllm.__main__ import main
from mini_vllm.bench import throughput
from mini_vllm.bench.serve import random_length_bounds, sample_requests
from mini_vllm.bench.throughput import (
    PRESETS,
    EngineSettings,
    ThroughputResult,
    ThroughputWorkload,
    engine_options,
    format_throughput_markdown,
)
from mini_vllm.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu" / "throughput_workload.py"


# -- the random dataset ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mean, ratio, bounds",
    [
        (100, 0.0, (100, 100)),
        (100, 0.5, (50, 150)),
        (10, 0.25, (7, 13)),  # floor(7.5), ceil(12.5)
        (1, 0.5, (1, 2)),  # a low end of 0 is raised to 1
        (562, 0.821, (100, 1024)),
    ],
)
def test_length_bounds_are_vllms_floor_and_ceil(mean, ratio, bounds):
    assert random_length_bounds(mean, ratio) == bounds


@pytest.mark.parametrize("ratio", [-0.1, 1.0, 1.5, float("nan")])
def test_a_range_ratio_outside_0_1_is_refused(ratio):
    with pytest.raises(UserError, match=r"--random-range-ratio must be in \[0, 1\)"):
        random_length_bounds(100, ratio)


def test_random_lengths_lie_in_the_ratio_range_and_follow_the_seed():
    def draw(seed):
        return sample_requests("random", 300, 40, 20, 0.5, seed)

    requests = draw(seed=3)
    prompt_lens = [r.prompt_len for r in requests]
    output_lens = [r.output_len for r in requests]
    assert all(len(r.prompt) == r.prompt_len for r in requests)  # exact lengths
    assert min(prompt_lens) >= 20 and max(prompt_lens) <= 60
    assert min(output_lens) >= 10 and max(output_lens) <= 30
    assert len(set(prompt_lens)) > 20  # spread over the range, not one value
    assert all(0 <= t < 256 for r in requests for t in r.prompt)
    assert draw(seed=3) == requests
    assert [r.prompt_len for r in draw(seed=4)] != prompt_lens


# -- the preset --------------------------------------------------------------------------------


def test_the_nano_vllm_preset_is_its_workload_in_random_dataset_terms():
    preset = PRESETS["nano-vllm"]
    workload = preset.workload
    assert (workload.dataset, workload.num_prompts, workload.seed) == ("random", 256, 0)
    assert workload.input_bounds == workload.output_bounds == (100, 1024)
    assert workload.temperature == 0.6
    assert (preset.max_num_seqs, preset.max_num_batched_tokens) == (256, 16384)
    # The docstring's claim: a ratio inside (1 - 101/562, 1 - 100/562] gives the same ends.
    for ratio in (1 - 101 / 562 + 1e-9, 0.8215, 1 - 100 / 562 - 1e-9):
        assert random_length_bounds(562, ratio) == (100, 1024)
    for ratio in (0.8202, 0.8221):
        assert random_length_bounds(562, ratio) != (100, 1024)
    vllm = preset.anchors[0]
    assert vllm.engine.startswith("vLLM") and vllm.output_tokens_per_s == pytest.approx(12627.36)
    assert "https://github.com/cosmoliu2002/nano-vllm-triton/issues/1" in vllm.source


def test_the_preset_sets_the_batch_limits_unless_given():
    preset = PRESETS["nano-vllm"].workload
    assert engine_options("cuda", preset) == {
        "device": "cuda",
        "seed": 0,
        "max_num_seqs": 256,
        "max_num_batched_tokens": 16384,
    }
    given = engine_options("cuda", preset, "float16", max_num_seqs=64)
    assert (given["max_num_seqs"], given["max_num_batched_tokens"]) == (64, 16384)
    assert given["dtype"] == "float16"
    # Without a preset, limits not given are left to the engine's device-dependent defaults.
    assert engine_options("cpu", ThroughputWorkload(dataset="random")) == {
        "device": "cpu",
        "seed": 0,
    }


def test_the_preset_report_has_the_published_anchors():
    result = ThroughputResult(
        model="llama-3.2-1b-like",
        device="cpu",
        machine="test machine",
        workload=PRESETS["nano-vllm"].workload,
        engine=EngineSettings(256, 16384, 2048, "full_and_piecewise", "bfloat16"),
        prompt_tokens=150_000,
        output_tokens=140_000,
        num_steps=1500,
        ours_s=20.0,
    )
    text = format_throughput_markdown(result, "python -m mini_vllm bench throughput --preset x")
    for expected in (
        "- date: ",
        "- machine: test machine",
        "- command: `python -m mini_vllm bench throughput --preset x`",
        "`max_num_seqs=256`",
        "`max_num_batched_tokens=16384`",
        "cudagraph mode `full_and_piecewise`",
        "dtype bfloat16",
        "prompt lengths uniform in [100, 1024] and output lengths uniform in [100, 1024]",
        "| mini_vllm `LLM.generate` | 20.00 | 7000.0 | 14500.0 | 12.80 |",
        "## Published anchors, same workload",
        "| 12,627 |",
        "(https://github.com/cosmoliu2002/nano-vllm-triton/issues/1)",
    ):
        assert expected in text, expected


# -- the command line --------------------------------------------------------------------------


class Measured(Exception):
    """Raised by the stand-in for the benchmark: the options got as far as measuring."""


@pytest.fixture
def calls(monkeypatch):
    got = []

    def stand_in(*args, **kwargs):
        got.append((args, kwargs))
        raise Measured

    monkeypatch.setattr(throughput, "run_throughput_bench", stand_in)
    return got


def _parsed(calls, *flags):
    with pytest.raises(Measured):
        main(["bench", "throughput", "--model", "tiny", *flags, "--no-output"])
    (model, device, workload), kwargs = calls[-1]
    return workload, kwargs


def test_the_cli_passes_the_random_dataset_options(calls):
    workload, kwargs = _parsed(
        calls,
        "--dataset-name", "random", "--num-prompts", "5", "--random-input-len", "10",
        "--random-output-len", "6", "--random-range-ratio", "0.3", "--seed", "7",
        "--temperature", "0.5", "--max-num-seqs", "3", "--max-num-batched-tokens", "99",
        "--dtype", "float32",
    )  # fmt: skip
    assert workload == ThroughputWorkload(
        dataset="random",
        num_prompts=5,
        input_len=10,
        output_len=6,
        range_ratio=0.3,
        seed=7,
        temperature=0.5,
    )
    assert kwargs["max_num_seqs"] == 3 and kwargs["max_num_batched_tokens"] == 99
    assert kwargs["dtype"] == "float32" and kwargs["with_hf"] is None  # off for random


def test_the_cli_defaults_are_the_questions_and_the_engines_limits(calls):
    workload, kwargs = _parsed(calls)
    assert workload == ThroughputWorkload(dataset="questions", num_prompts=16, output_len=64)
    assert kwargs["max_num_seqs"] is None and kwargs["max_num_batched_tokens"] is None
    workload, kwargs = _parsed(calls, "--dataset-name", "random", "--hf")
    assert (workload.num_prompts, workload.input_len, workload.output_len) == (100, 128, 64)
    assert kwargs["with_hf"] is True
    assert _parsed(calls, "--no-hf")[1]["with_hf"] is False


def test_the_cli_preset_keeps_a_given_batch_limit(calls):
    workload, kwargs = _parsed(calls, "--preset", "nano-vllm", "--max-num-seqs", "64")
    assert workload == PRESETS["nano-vllm"].workload
    assert kwargs["max_num_seqs"] == 64 and kwargs["max_num_batched_tokens"] is None


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--dataset-name", "random", "--random-range-ratio", "1"], "must be in [0, 1), got 1.0"),
        (["--dataset-name", "random", "--random-range-ratio", "-0.5"], "must be in [0, 1)"),
        (["--num-prompts", "0"], "--num-prompts must be >= 1, got 0"),
        (["--dataset-name", "random", "--num-prompts", "-3"], "--num-prompts must be >= 1"),
        (["--dataset-name", "random", "--random-input-len", "0"], "--random-input-len must be"),
        (["--dataset-name", "random", "--random-output-len", "0"], "--random-output-len must"),
        (["--new-tokens", "0"], "--new-tokens must be >= 1"),
        (["--temperature", "-1"], "--temperature must be a finite number >= 0"),
        (["--max-num-seqs", "0"], "--max-num-seqs must be >= 1"),
        (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens must be >= 1"),
        (["--random-input-len", "8"], "applies only to the random dataset"),
        (["--dataset-name", "random", "--new-tokens", "8"], "give --random-output-len"),
        (["--preset", "nano-vllm", "--num-prompts", "8"], "--preset nano-vllm fixes the workload"),
        (["--preset", "nano-vllm", "--dataset-name", "questions"], "drop --dataset-name"),
    ],
)
def test_the_cli_refuses_bad_options_before_measuring(calls, flags, message, capsys):
    assert main(["bench", "throughput", "--model", "tiny", *flags, "--no-output"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not calls


def test_the_cli_refuses_an_unknown_dataset_or_preset(capsys):
    for flags in (["--dataset-name", "sharegpt"], ["--preset", "vllm"]):
        with pytest.raises(SystemExit) as exit_:
            main(["bench", "throughput", *flags, "--no-output"])
        assert exit_.value.code == 2
        assert "invalid choice" in capsys.readouterr().err


def test_requests_longer_than_the_model_are_refused_before_loading(monkeypatch, capsys):
    monkeypatch.setattr(throughput, "_load", lambda *a, **k: pytest.fail("loaded"))
    argv = ["bench", "throughput", "--model", "tiny", "--no-output"]
    assert main([*argv, "--dataset-name", "random", "--random-input-len", "200"]) == 2
    assert "holds 256 positions; lower --random-input-len" in capsys.readouterr().err
    assert main([*argv, "--preset", "nano-vllm"]) == 2
    assert "run it on a model with a longer context" in capsys.readouterr().err


# -- a run ------------------------------------------------------------------------------------


def _table_row(text: str, header_start: str) -> dict[str, str]:
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    columns = [cell.strip() for cell in lines[at].strip("|").split("|")]
    cells = [cell.strip() for cell in lines[at + 2].strip("|").split("|")]
    return dict(zip(columns, cells))


def test_a_random_run_on_tiny_writes_the_numbers(tmp_path, capsys):
    out = tmp_path / "throughput.md"
    flags = ["--num-prompts", "6", "--random-input-len", "24", "--random-output-len", "8"]
    flags += ["--random-range-ratio", "0.5", "--seed", "5", "--max-num-seqs", "4"]
    argv = ["bench", "throughput", "--model", "tiny", "--dataset-name", "random", *flags]
    assert main([*argv, "--output", str(out)]) == 0
    text = out.read_text()
    expected = sample_requests("random", 6, 24, 8, 0.5, 5)
    totals = _table_row(text, "| prompts |")
    assert totals["prompts"] == "6"
    assert int(totals["prompt tokens"]) == sum(r.prompt_len for r in expected)
    assert int(totals["output tokens"]) == sum(r.output_len for r in expected)  # EOS ignored
    assert int(totals["engine steps"]) >= max(r.output_len for r in expected)
    rates = _table_row(text, "| engine |")
    output_rate, total_rate = float(rates["output tokens/s"]), float(rates["total tokens/s"])
    # The wall time is printed rounded; the rates' ratios are exact (one time for all three).
    assert output_rate > 0
    output_tokens, prompt_tokens = int(totals["output tokens"]), int(totals["prompt tokens"])
    assert output_rate / total_rate == pytest.approx(
        output_tokens / (output_tokens + prompt_tokens), rel=1e-2
    )
    assert float(rates["requests/s"]) / output_rate == pytest.approx(6 / output_tokens, rel=1e-2)
    for expected_line in ("- date: ", "- machine: ", "- command: `python -m mini_vllm bench"):
        assert expected_line in text
    assert "`max_num_seqs=4`" in text and "cudagraph mode `none`" in text
    assert "dtype float32" in text
    assert "transformers" not in text  # off by default for the random dataset
    assert "Published anchors" not in text
    assert "--random-range-ratio 0.5" in text and "--seed 5" in text


# -- scripts/gpu/throughput_workload.py --------------------------------------------------------


def _script_module():
    spec = importlib.util.spec_from_file_location("throughput_workload", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_script_draws_the_presets_requests():
    prompts, output_lens = _script_module().draw_workload(40, (100, 1024), (100, 1024), 0)
    preset = PRESETS["nano-vllm"].workload
    expected = sample_requests(
        "random", 40, preset.input_len, preset.output_len, preset.range_ratio, preset.seed
    )
    assert prompts == [r.prompt for r in expected]
    assert output_lens == [r.output_len for r in expected]


def test_the_script_runs_on_cpu_with_the_tiny_shape(tmp_path):
    out = tmp_path / "workload.md"
    flags = ["--models", "tiny", "--device", "cpu", "--num-prompts", "4"]
    flags += ["--input-range", "8,16", "--output-range", "4,8", "--max-model-len", "32"]
    flags += ["--max-num-seqs", "4", "--max-num-batched-tokens", "64", "--profile", "2"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *flags, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"tiny: [\d.]+ output tokens/s", done.stdout)
    row = _table_row(out.read_text(), "| model |")
    assert (row["model"], row["prompts"]) == ("tiny", "4")
    assert float(row["output tokens/s"]) > 0 and int(row["steps"]) > 0
    profile = (tmp_path / "workload-profile-tiny.txt").read_text()
    assert "top 40 by cumulative" in profile and "top 40 by tottime" in profile


def test_the_script_refuses_ranges_longer_than_max_model_len(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--max-model-len", "1000", "--out", str(tmp_path / "x.md")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 2
    assert "can reach 2048 tokens" in done.stderr and "--max-model-len is 1000" in done.stderr
