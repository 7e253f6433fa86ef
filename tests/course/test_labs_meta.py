"""The labs' own checks: the reference passes every lab test, the untouched starter fails every one.

A lab test that passes on the starter checks nothing the student wrote, so it is a
bug. The starter is taken from git (HEAD), not from the working tree, so a student
who has filled theirs in does not break this test; a starter not yet committed is
taken from the working tree. GPU-REQ tests skip in both runs where CUDA is absent.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LABS = sorted((ROOT / "labs").glob("phase-*/lab-*"))
LAB_IDS = [f"{lab.parent.name}/{lab.name}" for lab in LABS]
GPU_SKIP_MARK = "GPU-REQ"


@dataclass
class Outcome:
    name: str
    status: str  # passed, failed, error, skipped
    message: str = ""


def starter_files(lab: Path) -> list[Path]:
    return sorted(p for p in lab.glob("*.py"))


def pristine_copy(path: Path) -> bytes:
    """The committed version of a file, or the working copy if git has none."""
    relative = path.relative_to(ROOT).as_posix()
    result = subprocess.run(["git", "show", f"HEAD:{relative}"], cwd=ROOT, capture_output=True)
    return result.stdout if result.returncode == 0 else path.read_bytes()


def run_lab(
    lab: Path,
    impl: str,
    tmp_path: Path,
    starter_dir: Path | None = None,
    threads: int | None = None,
    reverse: bool = False,
) -> list[Outcome]:
    report = tmp_path / f"{impl}.xml"
    env = dict(os.environ, MINI_VLLM_IMPL=impl, PYTHONDONTWRITEBYTECODE="1")
    if threads is not None:
        env["OMP_NUM_THREADS"] = env["MINI_VLLM_TORCH_THREADS"] = str(threads)
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_ADDOPTS"):
        env.pop(name, None)
    if starter_dir is not None:
        env["MINI_VLLM_STARTER_DIR"] = str(starter_dir)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        str(lab),
        f"--impl={impl}",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        f"--junitxml={report}",
        "-o",
        "junit_family=xunit1",
        *(["-p", "labreverse"] if reverse else []),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if not report.exists():
        pytest.fail(
            f"pytest wrote no report for {lab.name} "
            f"({impl}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    outcomes = []
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        status, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                status, message = child.tag, child.get("message") or ""
                break
        outcomes.append(Outcome(name, "failed" if status == "failure" else status, message))
    if not outcomes:
        pytest.fail(f"no tests ran in {lab.name} ({impl}):\n{proc.stdout[-3000:]}")
    return outcomes


def collected_count(lab: Path) -> int:
    env = dict(os.environ, MINI_VLLM_IMPL="ref")
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(lab),
            "--impl=ref",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    found = re.search(r"(\d+) tests? collected", proc.stdout)
    if not found:
        pytest.fail(f"could not collect {lab.name} against the reference:\n{proc.stdout[-3000:]}")
    return int(found.group(1))


def is_gpu_skip(outcome: Outcome) -> bool:
    """A skip the lab is allowed: no GPU here, or an optional outside system (vLLM) absent."""
    return outcome.status == "skipped" and (
        GPU_SKIP_MARK in outcome.message or "OPTIONAL:" in outcome.message
    )


@pytest.mark.parametrize("lab", LABS, ids=LAB_IDS)
def test_lab_layout(lab: Path):
    readme = lab / "README.md"
    assert readme.exists(), f"{lab.name} has no README.md"
    text = readme.read_text()
    assert re.search(r"\b(CPU-OK|GPU-REQ)\b", text), (
        f"{lab.name}/README.md does not give the lab's tag"
    )
    assert f"pytest labs/{lab.parent.name}/{lab.name}" in text, (
        f"{lab.name}/README.md does not give the exact pytest command"
    )
    assert starter_files(lab), f"{lab.name} has no starter file"
    assert any("NotImplementedError" in p.read_text() for p in starter_files(lab)), (
        f"{lab.name}'s starter has no TODO raising NotImplementedError"
    )
    assert list((lab / "tests").glob("test_*.py")), f"{lab.name} has no tests/test_*.py"


@pytest.mark.parametrize(
    ("threads", "reverse"), [(1, False), (4, True)], ids=["1 thread", "4 threads, reversed"]
)
@pytest.mark.parametrize("lab", LABS, ids=LAB_IDS)
def test_lab_passes_on_reference(lab: Path, tmp_path: Path, threads: int, reverse: bool):
    """On one torch thread and on four (reductions split differently), in the collected
    order and reversed (no test leans on another having run)."""
    outcomes = run_lab(lab, "ref", tmp_path, threads=threads, reverse=reverse)
    bad = [o for o in outcomes if o.status != "passed" and not is_gpu_skip(o)]
    assert not bad, "reference fails lab tests:\n" + "\n".join(
        f"{o.status}: {o.name} {o.message[:300]}" for o in bad
    )


@pytest.mark.parametrize("lab", LABS, ids=LAB_IDS)
def test_every_lab_test_fails_on_pristine_starter(lab: Path, tmp_path: Path):
    starters = tmp_path / "starters" / lab.parent.name / lab.name
    starters.mkdir(parents=True)
    for path in starter_files(lab):
        (starters / path.name).write_bytes(pristine_copy(path))
    for extra in ("data",):  # lab data files the starter reads, if any
        if (lab / extra).is_dir():
            shutil.copytree(lab / extra, starters / extra)
    student = run_lab(lab, "student", tmp_path, starter_dir=starters.parent.parent)
    expected = collected_count(lab)
    assert len(student) == expected, (
        f"the starter run reported {len(student)} tests, the reference collects {expected}: "
        "the starter must import cleanly so every test can run and fail on its own"
    )
    passing = [o.name for o in student if o.status == "passed"]
    assert not passing, (
        "these lab tests pass on the untouched starter (they check nothing the student writes):\n"
        + "\n".join(passing)
    )
    odd_skips = [o.name for o in student if o.status == "skipped" and not is_gpu_skip(o)]
    assert not odd_skips, "these lab tests skip on the starter instead of failing:\n" + "\n".join(
        odd_skips
    )


# --- the starters keep the reference's given code -------------------------------------


def starter_references(lab: Path) -> dict[str, list[str]]:
    """{starter file: reference modules}, read from the `implementation(...)` calls of the
    lab's tests."""
    pairs: dict[str, list[str]] = {}
    for test_file in sorted((lab / "tests").glob("test_*.py")):
        for node in ast.walk(ast.parse(test_file.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "implementation":
                kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
                refs = kwargs["reference"]
                refs = [refs] if isinstance(refs, str) else list(refs)
                pairs.setdefault(kwargs["starter"], [])
                pairs[kwargs["starter"]] += [r for r in refs if r not in pairs[kwargs["starter"]]]
    return pairs


def _without_docstring(node: ast.AST) -> str:
    body = list(getattr(node, "body", []))
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    copy = type(node)(**{**{f: getattr(node, f) for f in node._fields}, "body": body})
    return ast.dump(copy)


def given_pieces(path: Path) -> dict[str, str]:
    """What a file defines, without docstrings: each top-level function, each method, and
    each class's field declarations (a dataclass's fields, an enum's members)."""
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found[node.name] = _without_docstring(node)
        elif isinstance(node, ast.ClassDef):
            fields = [ast.dump(i) for i in node.body if isinstance(i, (ast.AnnAssign, ast.Assign))]
            found[f"{node.name} (fields)"] = "\n".join(fields)
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found[f"{node.name}.{item.name}"] = _without_docstring(item)
    return found


def starter_differs(lab: Path) -> dict[str, str]:
    """{piece: why the starter's differs}, from the lab's `STARTER_DIFFERS` in
    tests/course/lab_checks/ (the reference does more than the lab asks, say)."""
    phase, number = lab.parent.name.removeprefix("phase-"), lab.name.split("-")[1]
    path = ROOT / "tests" / "course" / "lab_checks" / f"phase{phase}_lab{number}.py"
    if not path.exists():
        return {}
    spec = importlib.util.spec_from_file_location(f"lab_checks_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    differs = dict(getattr(module, "STARTER_DIFFERS", {}))
    assert all(isinstance(why, str) and why for why in differs.values()), (
        f"{path.name}: every STARTER_DIFFERS entry says why"
    )
    return differs


# A lab's predictions file (labs/labpredict.py) holds answers, not code: nothing in it is given.
PREDICTIONS = "predictions.py"
STARTER_PAIRS = [
    pytest.param(lab, starter, refs, id=f"{lab.parent.name}/{lab.name}/{starter}")
    for lab in LABS
    for starter, refs in starter_references(lab).items()
    if starter != PREDICTIONS
]


@pytest.mark.parametrize(("lab", "starter", "references"), STARTER_PAIRS)
def test_starter_given_code_matches_the_reference(lab: Path, starter: str, references: list[str]):
    """What a starter gives (not a TODO) is the reference's code, so that a student builds
    on exactly what the reference has: a dataclass field or a helper that drifted would
    make the lab test something else than the engine runs."""
    reference: dict[str, str] = {}
    for module in references:
        origin = importlib.util.find_spec(module).origin
        for name, dump in given_pieces(Path(origin)).items():
            reference.setdefault(name, dump)
    mine = given_pieces(lab / starter)
    allowed = starter_differs(lab)
    stale = [
        name
        for name, dump in mine.items()
        if "NotImplementedError" not in dump
        and name in reference
        and reference[name] != dump
        and name not in allowed
    ]
    assert not stale, f"{lab.name}/{starter} gives code that differs from {references}: {stale}"
    assert any("NotImplementedError" in dump for dump in mine.values())


@pytest.mark.parametrize("lab", LABS, ids=LAB_IDS)
def test_the_readme_does_not_point_at_the_labs_own_solution(lab: Path):
    """A lab's README links the chapter; the reference module its tests run against with
    `--impl=ref` is the solution, read after the lab in the phase's mini build."""
    text = (lab / "README.md").read_text()
    modules = {m for refs in starter_references(lab).values() for m in refs}
    named = [m for m in sorted(modules) if m.replace(".", "/") + ".py" in text]
    assert not named, f"{lab.name}/README.md names the file of its own solution: {named}"


def todo_functions(starter: Path) -> set[str]:
    """The functions and methods a starter leaves to the student (they raise
    NotImplementedError); `__init__` is left out, as every class has one."""
    names = set()
    for node in ast.walk(ast.parse(starter.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name != "__init__":
            raises = (n for n in ast.walk(node) if isinstance(n, ast.Raise))
            if any("NotImplementedError" in ast.unparse(n) for n in raises):
                names.add(node.name)
    return names


def anchors_defining(source: Path, names: set[str]) -> set[str]:
    """The mdBook anchors of `source` whose lines define one of `names`."""
    found, opened = set(), {}
    lines = source.read_text().splitlines()
    for i, line in enumerate(lines):
        if start := re.search(r"ANCHOR: (\w+)", line):
            opened[start.group(1)] = i
        elif (end := re.search(r"ANCHOR_END: (\w+)", line)) and end.group(1) in opened:
            body = "\n".join(lines[opened.pop(end.group(1)) : i])
            if any(re.search(rf"def {re.escape(name)}\(", body) for name in names):
                found.add(end.group(1))
    return found


@pytest.mark.parametrize("lab", LABS, ids=LAB_IDS)
def test_the_labs_solution_is_shown_only_in_the_mini_build(lab: Path):
    """Chapters, deep dives and exercises explain; the reference functions a lab asks for
    are included only by the phase's mini build, the walk-through read after the lab."""
    shown = []
    pages = [p for p in (ROOT / "book" / "src").rglob("*.md") if p.name != "02-mini-build.md"]
    for starter, modules in starter_references(lab).items():
        names = todo_functions(lab / starter)
        for module in modules:
            source = Path(importlib.util.find_spec(module).origin)
            relative = source.relative_to(ROOT).as_posix()
            for anchor in anchors_defining(source, names):
                include = re.compile(rf"\{{\{{#include [./]*{re.escape(relative)}:{anchor}\}}\}}")
                shown += [
                    f"{page.relative_to(ROOT)} includes {relative}:{anchor}"
                    for page in pages
                    if include.search(page.read_text())
                ]
    assert not shown, f"{lab.name}'s solution is shown before the mini build:\n" + "\n".join(shown)
