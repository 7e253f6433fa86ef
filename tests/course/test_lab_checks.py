"""The labs' checks against the reference changed on the fly (`labs/mutation.py`).

For each lab, `tests/course/lab_checks/phaseNN_labMM.py` holds:
- `MUTANTS`: at least six mistakes students make (CPU-OK labs). Each is applied to the
  reference and the lab's tests run against it with `--impl=ref -x`; a mutant that
  passes them all is a hole in the lab's tests. One pytest process a mutant, stopping at
  the first failure, so a caught mutant costs a second or two.
- `STEPS`: {step: the reference functions that step asks for}. Step k's tests must pass
  with every later step's functions stubbed out (a student can run them before writing
  the rest) and fail with step k's own stubbed (they test that step).
- `STARTER_DIFFERS` (optional): given code of the starter that may differ from the
  reference, with the reason (read by tests/course/test_labs_meta.py).

Every lab test carries exactly one `stepN` marker, and the lab's README gives the
command `pytest labs/<phase>/<lab> -m stepN` for each step.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from mini_vllm.cli import grade

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "labs"))
from mutation import ENV_VAR, Mutant, Stubs  # noqa: E402

MUTANTS_DIR = Path(__file__).resolve().parent / "lab_checks"
LABS = sorted(ROOT.glob("labs/phase-*/lab-*"))
MIN_MUTANTS = 6


def mutants_file(lab: Path) -> Path:
    phase, number = lab.parent.name.removeprefix("phase-"), lab.name.split("-")[1]
    return MUTANTS_DIR / f"phase{phase}_lab{number}.py"


def is_cpu_ok(lab: Path) -> bool:
    return grade.lab_tag(lab) == "CPU-OK"


def lab_checks(lab: Path):
    path = mutants_file(lab)
    spec = importlib.util.spec_from_file_location(f"lab_checks_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_mutants(lab: Path) -> list[Mutant]:
    return list(getattr(lab_checks(lab), "MUTANTS", []))


def load_steps(lab: Path) -> dict[int, list[str]]:
    return {int(k): list(v) for k, v in getattr(lab_checks(lab), "STEPS", {}).items()}


def run_lab_pytest(lab: Path, change: Mutant | Stubs | None, *extra: str):
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    if change is not None:
        env[ENV_VAR] = change.to_env()
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST", ENV_VAR):
        if change is None or name != ENV_VAR:
            env.pop(name, None)
    cmd = [sys.executable, "-m", "pytest", str(lab), "--impl=ref", "-q", "-p", "mutation"]
    cmd += ["-p", "no:cacheprovider", "-p", "no:randomly", *extra]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


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
    proc = run_lab_pytest(lab, mutant, "-x")
    assert proc.returncode != 0, (
        f"not caught: {mutant.mistake}\n(every test of {lab.name} passed with this mistake in "
        f"{mutant.module})\n{proc.stdout[-1500:]}"
    )
    assert proc.returncode == 1, (
        f"the run with mutant {mutant.name!r} did not end in test failures "
        f"(exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
    )


# --- steps ------------------------------------------------------------------------------

STEP_LABS = [lab for lab in CPU_LABS if mutants_file(lab).exists() and load_steps(lab)]
STEP_CASES = [
    pytest.param(lab, step, id=f"{lab.parent.name}/{lab.name.split('-')[1]}: step {step}")
    for lab in STEP_LABS
    for step in load_steps(lab)
]


def collected_steps(lab: Path) -> dict[str, int | None]:
    """{test id: its step}, collected against the reference."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "steps.json"
        env = dict(os.environ, MINI_VLLM_GRADE_REPORT=str(report))
        env.pop("PYTEST_XDIST_WORKER", None)
        cmd = [sys.executable, "-m", "pytest", str(lab), "--impl=ref", "--collect-only", "-q"]
        cmd += ["-p", "labgrade", "-p", "no:cacheprovider"]
        subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        return {e["nodeid"]: e["step"] for e in json.loads(report.read_text())}


@pytest.mark.parametrize("lab", CPU_LABS, ids=[f"{lab.parent.name}/{lab.name}" for lab in CPU_LABS])
def test_every_lab_test_has_one_step_and_the_readme_gives_each_steps_command(lab: Path):
    steps = collected_steps(lab)
    assert steps, f"no tests collected in {lab}"
    unmarked = [nodeid for nodeid, step in steps.items() if step is None]
    assert not unmarked, "lab tests without a stepN marker:\n" + "\n".join(unmarked)
    readme = (lab / "README.md").read_text()
    for step in sorted(set(steps.values())):
        command = f"pytest labs/{lab.parent.name}/{lab.name} -m step{step}"
        assert command in readme, f"{lab.name}/README.md does not give `{command}`"
    declared = set(load_steps(lab)) if mutants_file(lab).exists() else set()
    assert declared == set(steps.values()), (
        f"STEPS in {mutants_file(lab).name} names steps {sorted(declared)}, "
        f"the tests have {sorted(set(steps.values()))}"
    )


@pytest.mark.parametrize(("lab", "step"), STEP_CASES)
def test_a_steps_tests_need_only_that_step_and_the_ones_before(lab: Path, step: int):
    steps = load_steps(lab)
    later = tuple(t for k, targets in steps.items() if k > step for t in targets)
    if later:
        proc = run_lab_pytest(lab, Stubs(later), "-m", f"step{step}")
        assert proc.returncode == 0, (
            f"step {step}'s tests fail when the later steps are not written yet "
            f"({', '.join(later)}):\n{proc.stdout[-3000:]}"
        )
    own = tuple(steps[step]) + later
    proc = run_lab_pytest(lab, Stubs(own), "-m", f"step{step}")
    assert proc.returncode == 1, (
        f"step {step}'s tests pass with its own functions left out ({', '.join(steps[step])}):"
        f"\n{proc.stdout[-3000:]}"
    )
