"""The mutation check: every planted student mistake fails its lab's tests.

For each CPU-OK lab, `tests/lab_mutants/phaseNN_labMM.py` lists at least six mistakes
students make (`labs/mutation.py`'s `Mutant`). Each one is applied to the reference on
the fly and the lab's tests run against it with `--impl=ref -x`; a mutant that passes
them all is a hole in the lab's tests. One pytest process a mutant, stopping at the
first failure, so a caught mutant costs a second or two.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "labs"))
from mutation import ENV_VAR, Mutant  # noqa: E402

MUTANTS_DIR = Path(__file__).resolve().parent / "lab_mutants"
LABS = sorted(ROOT.glob("labs/phase-*/lab-*"))
MIN_MUTANTS = 6


def mutants_file(lab: Path) -> Path:
    phase, number = lab.parent.name.removeprefix("phase-"), lab.name.split("-")[1]
    return MUTANTS_DIR / f"phase{phase}_lab{number}.py"


def is_cpu_ok(lab: Path) -> bool:
    return "CPU-OK" in (lab / "README.md").read_text()


def load_mutants(lab: Path) -> list[Mutant]:
    path = mutants_file(lab)
    spec = importlib.util.spec_from_file_location(f"lab_mutants_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.MUTANTS)


CPU_LABS = [lab for lab in LABS if is_cpu_ok(lab)]
CASES = [
    pytest.param(lab, mutant, id=f"{lab.parent.name}/{lab.name.split('-')[1]}: {mutant.name}")
    for lab in CPU_LABS
    if mutants_file(lab).exists()
    for mutant in load_mutants(lab)
]


@pytest.mark.parametrize("lab", CPU_LABS, ids=[f"{lab.parent.name}/{lab.name}" for lab in CPU_LABS])
def test_every_cpu_lab_plants_at_least_six_mistakes(lab: Path):
    assert mutants_file(lab).exists(), f"{lab} has no {mutants_file(lab).relative_to(ROOT)}"
    mutants = load_mutants(lab)
    assert len(mutants) >= MIN_MUTANTS, f"{lab.name}: {len(mutants)} mutants, at least 6 wanted"
    assert len({m.name for m in mutants}) == len(mutants), "mutant names must differ"


@pytest.mark.parametrize(("lab", "mutant"), CASES)
def test_the_lab_catches_the_mistake(lab: Path, mutant: Mutant):
    source = mutant.mutated_source()  # raises if the mutant no longer applies
    compile(source, mutant.source_path(), "exec")  # a syntax error would be caught for nothing
    env = dict(os.environ, **{ENV_VAR: mutant.to_env()}, PYTHONDONTWRITEBYTECODE="1")
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST"):
        env.pop(name, None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(lab),
            "--impl=ref",
            "-x",
            "-q",
            "-p",
            "mutation",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode != 0, (
        f"not caught: {mutant.mistake}\n(every test of {lab.name} passed with this mistake in "
        f"{mutant.module})\n{proc.stdout[-1500:]}"
    )
    assert proc.returncode == 1, (
        f"the run with mutant {mutant.name!r} did not end in test failures "
        f"(exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
    )
