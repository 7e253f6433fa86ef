"""`python -m mini_vllm grade`: all zero on the untouched starters, all full on the reference
put in the starters' place, a Gradescope results.json, and clear errors."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mini_vllm.cli import grade

ROOT = Path(__file__).resolve().parents[2]
LABS = grade.all_labs()


def run_grade(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mini_vllm", "grade", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )


def pristine_starters(dest: Path) -> Path:
    """The committed starters, laid out like labs/ (a class's untouched submissions)."""
    for lab in LABS:
        target = dest / lab.parent.name / lab.name
        target.mkdir(parents=True)
        for path in lab.glob("*.py"):
            relative = path.relative_to(ROOT).as_posix()
            shown = subprocess.run(
                ["git", "show", f"HEAD:{relative}"], cwd=ROOT, capture_output=True
            )
            target.joinpath(path.name).write_bytes(
                shown.stdout if shown.returncode == 0 else path.read_bytes()
            )
        if (lab / "data").is_dir():
            (target / "data").symlink_to(lab / "data")
    return dest


def reference_starters(dest: Path) -> Path:
    """Each starter file replaced by one that re-exports the reference modules its tests
    name: the reference copied into the starters."""
    for lab in LABS:
        target = dest / lab.parent.name / lab.name
        target.mkdir(parents=True)
        modules: dict[str, list[str]] = {}
        for test_file in (lab / "tests").glob("test_*.py"):
            for node in ast.walk(ast.parse(test_file.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "implementation":
                    kw = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
                    refs = (
                        [kw["reference"]] if isinstance(kw["reference"], str) else kw["reference"]
                    )
                    modules.setdefault(kw["starter"], []).extend(refs)
        for starter, refs in modules.items():
            refs = list(dict.fromkeys(refs))
            if len(refs) == 1:  # the reference's own source, so a test can patch its globals
                source = importlib.util.find_spec(refs[0]).origin
                target.joinpath(starter).write_text(Path(source).read_text())
                continue
            target.joinpath(starter).write_text(
                "import importlib\n\n"
                f"for _name in {refs!r}:\n"
                "    _module = importlib.import_module(_name)\n"
                "    globals().update({k: v for k, v in vars(_module).items() if k[:2] != '__'})\n"
            )
    return dest


def scores(results_json: Path) -> tuple[float, int]:
    data = json.loads(results_json.read_text())
    assert {"name", "score", "max_score", "output"} <= set(data["tests"][0])
    return data["score"], len(data["tests"])


CPU_LABS = [lab for lab in LABS if grade.lab_tag(lab) == "CPU-OK"]


def test_untouched_starters_score_zero_and_the_reference_scores_full(tmp_path: Path):
    selectors = [grade.lab_key(lab) for lab in CPU_LABS]
    zero = tmp_path / "zero.json"
    proc = run_grade(
        *selectors,
        "--submission",
        str(pristine_starters(tmp_path / "a")),
        "--results-json",
        str(zero),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    score, total = scores(zero)
    assert total > 100 and score == 0, proc.stdout
    assert "total" in proc.stdout and f"0/{total}" in proc.stdout

    full = tmp_path / "full.json"
    proc = run_grade(
        *selectors,
        "--submission",
        str(reference_starters(tmp_path / "b")),
        "--results-json",
        str(full),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    score, total_full = scores(full)
    assert total_full == total and score == total, proc.stdout
    # One row a step of every lab, each step full.
    for lab in CPU_LABS:
        assert grade.lab_key(lab) in proc.stdout


def test_a_flat_submission_of_one_lab_is_graded(tmp_path: Path):
    lab = next(lab for lab in CPU_LABS if lab.parent.name == "phase-02")
    nested = reference_starters(tmp_path / "ref")
    flat = tmp_path / "flat"
    flat.mkdir()
    for path in (nested / lab.parent.name / lab.name).glob("*.py"):
        flat.joinpath(path.name).write_text(path.read_text())
    proc = run_grade(grade.lab_key(lab), "--submission", str(flat))
    assert proc.returncode == 0, proc.stderr[-3000:]
    total_line = proc.stdout.strip().splitlines()[-1].split()
    passed, total = map(int, total_line[1].split("/"))
    assert passed == total > 0


def test_labs_are_named_by_phase_and_number():
    assert grade.select_labs(["phase-02"]) == [grade.labs_root() / "phase-02/lab-01-block-manager"]
    assert grade.select_labs(["labs/phase-05/lab-03/"]) == [
        grade.labs_root() / "phase-05/lab-03-cudagraph-mode"
    ]
    assert len(grade.select_labs(["phase-05"])) == 6
    assert grade.select_labs([]) == LABS


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["phase-09"], "no lab matches 'phase-09'; the labs are: phase-00/lab-01-decode-loop"),
        (["phase-05/lab-1"], "no lab matches"),
        (["--submission", "/nonexistent/dir"], "not a directory"),
        (["--impl", "ref", "--submission", "."], "leave out --impl ref"),
        (["--results-json", "/proc/nope/results.json"], "cannot write there"),
    ],
)
def test_mistakes_get_a_message_that_says_what_to_do(args, message):
    proc = run_grade(*args)
    assert proc.returncode == 2
    assert message in proc.stderr


def fake_run_lab(lab: Path, impl: str, submission: Path | None) -> list[grade.TestResult]:
    """Two tests a lab, one passing: the grading around run_lab, without its minute."""
    return [
        grade.TestResult(grade.lab_key(lab), "test_a", 1, "passed", ""),
        grade.TestResult(grade.lab_key(lab), "test_b", 2, "failed", "AssertionError"),
    ]


def test_grading_every_lab_says_first_how_long_it_takes_and_how_to_grade_one(monkeypatch, capsys):
    from mini_vllm.__main__ import main

    monkeypatch.setattr(grade, "run_lab", fake_run_lab)
    assert main(["grade"]) == 0
    captured = capsys.readouterr()
    first, *progress = captured.err.splitlines()
    assert first.startswith(f"grading all {len(LABS)} labs, one pytest run each: about ")
    assert "minutes" in first and f"grade {grade.lab_key(LABS[0])}" in first
    # A line a lab as it is graded, with what is left; then how to grade one lab.
    assert progress[0].startswith(f"[1/{len(LABS)}] {grade.lab_key(LABS[0])} ... 1/2 passed in")
    assert "to go" in progress[0] and "to go" not in progress[len(LABS) - 1]
    assert progress[-1].startswith("one lab, step by step: ") and "mini_vllm grade" in progress[-1]
    # The table: each lab's steps, then its own total; the last line, the total of all.
    rows = captured.out.splitlines()
    for lab in LABS:
        assert any(row.split()[:3] == [grade.lab_key(lab), "all", "1/2"] for row in rows)
    assert rows[-1].split() == ["total", f"{len(LABS)}/{2 * len(LABS)}"]


def test_grading_one_lab_starts_at_once(monkeypatch, capsys):
    from mini_vllm.__main__ import main

    monkeypatch.setattr(grade, "run_lab", fake_run_lab)
    assert main(["grade", "phase-02"]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith("[1/1] phase-02/lab-01-block-manager ... 1/2 passed in")
    assert "grading all" not in captured.err and "all" not in captured.out.split()
    assert captured.out.splitlines()[-1].split() == ["total", "1/2"]


def test_the_time_to_grade_every_lab_is_said_in_whole_minutes():
    notice = grade.all_labs_notice(13, LABS[0])
    assert "about 1 to 2 minutes on two idle cores" in notice
    assert "about 4 to 8 minutes" in grade.all_labs_notice(50, LABS[0])
