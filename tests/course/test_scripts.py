"""Every script in scripts/ says how to run it, runs
that way, and uses only mini_vllm's public names.

The figure scripts are drawn for real in test_figures.py; the GPU scripts run for real in
scripts/gpu/suite.sh on a GPU. Here, on any machine: each prints its help, and a GPU
script without CUDA says so and exits 2 instead of failing half-way.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p for p in (ROOT / "scripts").rglob("*") if p.suffix in (".py", ".sh"))
# Helpers the scripts import; they are not run on their own.
KITS = {"figurekit.py", "gpukit.py", "factcheck_parts.py", "per_head_decode.py"}
RUNNABLE_PY = [p for p in SCRIPTS if p.suffix == ".py" and p.name not in KITS]
GPU_MEASURES = [
    p for p in RUNNABLE_PY if p.parent.name == "gpu" and p.name != "run_notebook_cells.py"
]


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _header(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        return ast.get_docstring(ast.parse(text)) or ""
    return "\n".join(line for line in text.splitlines() if line.startswith("#"))


@pytest.mark.parametrize("script", SCRIPTS, ids=_rel)
def test_the_header_says_how_to_run_it(script):
    header = _header(script)
    assert header, f"{_rel(script)} has no docstring or header comment"
    if script.name not in KITS:
        assert _rel(script) in header, (
            f"{_rel(script)}'s header does not show the command that runs it"
        )


@pytest.mark.parametrize("script", RUNNABLE_PY, ids=_rel)
def test_help_runs(script):
    proc = subprocess.run(
        [sys.executable, str(script), "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout


@pytest.mark.parametrize("script", GPU_MEASURES, ids=_rel)
def test_a_gpu_script_without_cuda_says_so(script, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is here: scripts/gpu/suite.sh runs this script for real")
    proc = subprocess.run(
        [sys.executable, str(script), "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "needs an NVIDIA GPU with CUDA" in proc.stderr, proc.stderr
    assert not list(tmp_path.iterdir()), "it wrote a report although it measured nothing"


def test_the_gpu_suite_is_valid_shell():
    subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu" / "suite.sh")], check=True)


@pytest.mark.parametrize("script", [p for p in SCRIPTS if p.suffix == ".py"], ids=_rel)
def test_no_script_reaches_into_mini_vllms_private_names(script):
    tree = ast.parse(script.read_text(encoding="utf-8"))
    private = []
    modules = (
        set()
    )  # names bound to mini_vllm modules (import mini_vllm.x as y / from mini_vllm.x import module)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mini_vllm"):
            private += [alias.name for alias in node.names if alias.name.startswith("_")]
            modules.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            modules.update(
                alias.asname or alias.name
                for alias in node.names
                if alias.name.startswith("mini_vllm")
            )
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            if isinstance(node.value, ast.Name) and node.value.id in modules:
                private.append(f"{node.value.id}.{node.attr}")
    assert not private, f"{_rel(script)} uses private names of mini_vllm: {private}"


def test_scripts_are_only_setup_figures_notebooks_and_gpu_measurements():
    top = sorted(p.name for p in (ROOT / "scripts").iterdir() if p.name != "__pycache__")
    assert top == ["bootstrap.py", "execute_notebooks.py", "figures", "gpu"], top
    assert not [p for p in SCRIPTS if re.search(r"final|_ab\b|variants", p.stem)], (
        "a run log crept back in"
    )
