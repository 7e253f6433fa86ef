"""The labs' checks against the reference changed on the fly (`labs/mutation.py`).

For each lab, `tests/course/lab_checks/phaseNN_labMM.py` holds:
- `MUTANTS`: at least six mistakes students make (CPU-OK labs). Each is applied to the
  reference and the lab's tests run against it with `--impl=ref -x`; a mutant that
  passes them all is a hole in the lab's tests. One pytest run a mutant, stopping at the
  first failure, each in a process forked from one that has imported torch, pytest and
  hypothesis already (`labs/mutation_runner.py`), so a caught mutant costs a fraction of
  a second.
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
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from mini_vllm.cli import grade

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "labs"))
from labgrade import REPORT_VAR  # noqa: E402
from mutation import ENV_VAR, Mutant, Stubs  # noqa: E402
from mutation_runner import PRELOAD, PRELOAD_REWRITTEN, run_pytest  # noqa: E402

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


PER_RUN = (ENV_VAR, REPORT_VAR)  # read by the labs' plugins, not at import


def lab_env(change: Mutant | Stubs | None = None, **run_env: str) -> dict[str, str]:
    """The environment of a lab run: this one without pytest's own variables, with
    `change` and `run_env` (variables in PER_RUN) added."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST", ENV_VAR):
        env.pop(name, None)
    if change is not None:
        env[ENV_VAR] = change.to_env()
    return env | run_env


def run_lab_pytest(lab: Path, change: Mutant | Stubs | None, *extra: str, **run_env: str):
    """`python -m pytest <lab> --impl=ref ...` with `change` applied to the reference."""
    args = [lab, "--impl=ref", "-q", "-p", "mutation", "-p", "no:cacheprovider"]
    args += ["-p", "no:randomly", *extra]
    env = lab_env(change, **run_env)
    try:
        return run_pytest(args, env=env, cwd=ROOT, timeout=600, per_run=PER_RUN)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"pytest {' '.join(map(str, args))} ran past {exc.timeout:.0f} s:\n"
            f"{(exc.stdout or '')[-3000:]}\n{(exc.stderr or '')[-2000:]}"
        )


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
        args = ("--collect-only", "-p", "labgrade")
        proc = run_lab_pytest(lab, None, *args, **{REPORT_VAR: str(report)})
        assert report.exists(), f"collecting {lab.name} wrote no report:\n{proc.stdout[-3000:]}"
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


# --- the runner -------------------------------------------------------------------------

# Imports what the server has imported, so that a fresh process has made the same changes
# (torch._inductor sets TORCHINDUCTOR_CACHE_DIR, for one), then writes down what it sees.
PROBE = f"""
import importlib, json, os, sys

for name in {PRELOAD + PRELOAD_REWRITTEN!r}:
    importlib.import_module(name)


def test_probe():
    import torch

    seen = {{
        "argv": sys.argv,
        "path": sys.path,
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "main": sys.modules["__main__"].__file__,
        "no_bytecode": sys.dont_write_bytecode,
        "torch_threads": torch.get_num_threads(),
    }}
    with open(os.environ[{REPORT_VAR!r}], "w") as f:
        json.dump(seen, f)
"""


def test_a_run_sees_what_a_fresh_pytest_process_sees(tmp_path: Path):
    (tmp_path / "test_probe.py").write_text(PROBE)
    args = [str(tmp_path / "test_probe.py"), "-q", "-p", "no:cacheprovider"]
    report = tmp_path / "seen.json"
    env = lab_env(**{REPORT_VAR: str(report)})
    cmd = [sys.executable, "-m", "pytest", *args]
    runs = {
        "runner": lambda: run_pytest(args, env=env, cwd=ROOT, timeout=120, per_run=PER_RUN),
        "fresh": lambda: subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        ),
    }
    seen, output = {}, {}
    for name, run in runs.items():
        proc = run()
        assert proc.returncode == 0, proc.stdout + proc.stderr
        seen[name] = json.loads(report.read_text())
        output[name] = re.sub(r" in [\d.]+s", "", proc.stdout)
    assert seen["runner"] == seen["fresh"]
    # No warning either that pytest found a preloaded module it could not rewrite.
    assert output["runner"] == output["fresh"]


def test_a_run_that_crashes_or_hangs_comes_back_with_its_output(tmp_path: Path):
    (tmp_path / "test_crash.py").write_text(
        "import os, signal\n\ndef test_crash():\n    os.kill(os.getpid(), signal.SIGSEGV)\n"
    )
    (tmp_path / "test_hang.py").write_text(
        "import time\n\ndef test_hang():\n    print('started', flush=True)\n    time.sleep(600)\n"
    )

    def run(*args, timeout: float = 60):
        return run_pytest(args, env=lab_env(), cwd=ROOT, timeout=timeout, per_run=PER_RUN)

    options = ["-q", "-s", "-p", "no:cacheprovider"]
    proc = run(tmp_path / "test_crash.py", *options)
    assert proc.returncode == -signal.SIGSEGV, proc.stdout + proc.stderr
    assert "Segmentation fault" in proc.stderr  # pytest's faulthandler, from the child
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        run(tmp_path / "test_hang.py", *options, timeout=3)
    assert "started" in caught.value.stdout
    proc = run("--version")  # the server goes on
    assert proc.returncode == 0, proc.stdout + proc.stderr
