"""What every lab's tests share: mini_vllm runs its reading path.

A lab is about the code a student writes, plain torch, which is the reference's
`forward_native` (and the engine around it). So every lab test runs with mini_vllm's own
kernels off (`custom_ops="none"`, mini_vllm/_custom_ops.py): with `--impl=ref` the tests
exercise the reference's plain code, as they would exercise the student's, and the model
or engine a test builds around the student's code is the same plain code.

The labs run in the course's environment, `.venv/` (python3 scripts/bootstrap.py setup):
a pytest from another Python stops at once, naming the packages it lacks and the command.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys

import pytest

NEEDED = ("torch", "numpy", "hypothesis")


def pytest_configure(config: pytest.Config) -> None:
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if missing:
        venv = os.environ.get("MINI_VLLM_VENV", config.rootpath / ".venv")
        bin_dir = os.path.relpath(os.path.join(venv, "Scripts" if os.name == "nt" else "bin"))
        args = shlex.join(["-m", "pytest", *config.invocation_params.args])
        raise pytest.UsageError(
            f"this Python ({sys.executable}) has no {', '.join(missing)}: the labs run in the "
            f"course's environment. Run `{os.path.join(bin_dir, 'python')} {args}`, or activate "
            f"it first (`source {os.path.join(bin_dir, 'activate')}`). No .venv/ yet? "
            "`python3 scripts/bootstrap.py setup`, from the repository's root, makes it"
        )


@pytest.fixture(autouse=True)
def reading_path_only():
    from mini_vllm import _custom_ops as ops

    with ops.custom_ops_context("none"):
        yield
