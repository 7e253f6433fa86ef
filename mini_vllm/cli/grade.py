"""`python -m mini_vllm grade`: run the labs' tests and score them, step by step.

Runs each lab's tests (one pytest process a lab) against the starters in the
repository, against a student's submission (`--submission DIR`), or against the
reference (`--impl ref`), then prints a table (lab, step, passed/total, and each lab's
total when there are several) and can write the result in the Gradescope autograder
format (`--results-json`): one entry a test, with its name, score, max_score and the
failure's output. A student grades their own lab by naming it (`grade phase-02/lab-01`,
a few seconds); with no lab named, every lab is graded (about 1 to 2 minutes on two idle
cores, several times that on a busy machine). A test's step is its `stepN` marker; a
GPU-REQ test that skipped for lack of a GPU scores 0 and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from mini_vllm.errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[2]
# What grading one lab takes on two idle cores (measured: 3 to 12 s, most of it pytest
# starting and importing torch); a busy machine takes several times longer.
SECONDS_PER_LAB = (5, 10)


@dataclass
class TestResult:
    lab: str  # "phase-02/lab-01-block-manager"
    name: str
    step: int | None
    outcome: str  # passed, failed, error, skipped, not run
    output: str


def labs_root() -> Path:
    labs = REPO_ROOT / "labs"
    if not (labs / "labkit.py").exists():
        raise UserError(
            f"no labs/ next to the mini_vllm package ({REPO_ROOT}): grade runs from a clone "
            "of the course repository (git clone, then pip install -e .)"
        )
    return labs


def all_labs() -> list[Path]:
    return sorted(labs_root().glob("phase-*/lab-*"))


def lab_tag(lab: Path) -> str:
    """CPU-OK or GPU-REQ, from the README's first `**Tag: ...**`."""
    found = re.search(r"\*\*Tag: (CPU-OK|GPU-REQ)\*\*", (lab / "README.md").read_text())
    if not found:
        raise ValueError(f"{lab}/README.md gives no **Tag: CPU-OK** or **Tag: GPU-REQ**")
    return found.group(1)


def lab_key(lab: Path) -> str:
    return f"{lab.parent.name}/{lab.name}"


def select_labs(selectors: list[str]) -> list[Path]:
    """Labs named as `phase-02`, `phase-02/lab-01`, `phase-02/lab-01-block-manager` or a path."""
    labs = all_labs()
    if not selectors:
        return labs
    chosen: list[Path] = []
    for raw in selectors:
        text = raw.strip().rstrip("/").removeprefix("labs/")
        matches = [lab for lab in labs if lab_key(lab) == text or lab_key(lab).startswith(text)]
        matches = [m for m in matches if lab_key(m) == text or lab_key(m)[len(text)] in "/-"]
        if not matches:
            names = ", ".join(lab_key(lab) for lab in labs)
            raise UserError(f"no lab matches {raw!r}; the labs are: {names}")
        chosen += [m for m in matches if m not in chosen]
    return chosen


def run_lab(lab: Path, impl: str, submission: Path | None) -> list[TestResult]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        env = dict(os.environ, MINI_VLLM_GRADE_REPORT=str(report), PYTHONDONTWRITEBYTECODE="1")
        env.pop("PYTEST_ADDOPTS", None)
        if submission is not None:
            env["MINI_VLLM_STARTER_DIR"] = str(submission.resolve())
        cmd = [sys.executable, "-m", "pytest", str(lab), f"--impl={impl}", "-q"]
        cmd += ["-p", "labgrade", "-p", "no:cacheprovider", "-p", "no:randomly"]
        proc = subprocess.run(
            cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1800
        )
        if not report.exists():
            # Collection failed before any test was known (a syntax error in the starter, say).
            return [TestResult(lab_key(lab), "collection", None, "error", proc.stdout[-3000:])]
        entries = json.loads(report.read_text())
    if not entries:
        return [TestResult(lab_key(lab), "collection", None, "error", proc.stdout[-3000:])]
    return [
        TestResult(lab_key(lab), e["name"], e["step"], e["outcome"], e["output"]) for e in entries
    ]


def format_table(results: list[TestResult]) -> str:
    by_step: dict[tuple[str, int | None], list[TestResult]] = defaultdict(list)
    for r in results:
        by_step[(r.lab, r.step)].append(r)
    rows = [("lab", "step", "passed", "note")]
    labs = sorted({lab for lab, _ in by_step})
    for lab in labs:
        steps = sorted((step for name, step in by_step if name == lab), key=lambda s: s or 0)
        for step in steps:
            group = by_step[(lab, step)]
            passed = sum(r.outcome == "passed" for r in group)
            skipped = sum(r.outcome == "skipped" for r in group)
            note = f"{skipped} skipped (GPU-REQ without a GPU)" if skipped else ""
            rows.append((lab, "-" if step is None else str(step), f"{passed}/{len(group)}", note))
        if len(labs) > 1:  # the lab's own total, when several labs share the table
            mine = [r for r in results if r.lab == lab]
            passed = sum(r.outcome == "passed" for r in mine)
            rows.append((lab, "all", f"{passed}/{len(mine)}", "lab total"))
    total = sum(r.outcome == "passed" for r in results)
    rows.append(("total", "", f"{total}/{len(results)}", ""))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def gradescope_results(results: list[TestResult]) -> dict:
    """Gradescope's results.json: one test entry a lab test, a point each."""
    tests = []
    for r in results:
        step = f" (step {r.step})" if r.step is not None else ""
        tests.append(
            {
                "name": f"{r.lab}{step}: {r.name}",
                "score": 1.0 if r.outcome == "passed" else 0.0,
                "max_score": 1.0,
                "status": "passed" if r.outcome == "passed" else "failed",
                "output": r.output if r.outcome != "passed" else "",
            }
        )
    return {"score": sum(t["score"] for t in tests), "tests": tests}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "grade",
        help="run the labs' tests and print a score per lab and step (for instructors)",
        description=" ".join(__doc__.split("\n\n")[1].split()),
    )
    p.add_argument(
        "labs",
        nargs="*",
        metavar="LAB",
        help="labs to grade: phase-02, phase-02/lab-01 or phase-02/lab-01-block-manager "
        "(default: every lab)",
    )
    p.add_argument(
        "--impl",
        choices=("student", "ref"),
        default="student",
        help="grade the starters (student, the default) or the mini_vllm reference (ref)",
    )
    p.add_argument(
        "--submission",
        type=Path,
        help="a student's files instead of the repository's starters: laid out like labs/ "
        "(phase-02/lab-01-block-manager/block_manager.py), or the starter files of one lab "
        "side by side",
    )
    p.add_argument(
        "--results-json",
        type=Path,
        help="also write the scores in Gradescope's results.json format to this file",
    )


def grade_command() -> str:
    """How the reader runs grade: with the Python running this one, as they would type it."""
    python = Path(sys.executable)
    try:
        return f"{python.relative_to(REPO_ROOT)} -m mini_vllm grade"
    except ValueError:
        return "python -m mini_vllm grade"


def all_labs_notice(count: int, example: Path) -> str:
    """Said before grading every lab: how long it takes, and how to grade just one."""
    low, high = (count * s / 60 for s in SECONDS_PER_LAB)
    return (
        f"grading all {count} labs, one pytest run each: about {max(1, round(low))} to "
        f"{max(2, round(high))} minutes on two idle cores, several times that on a busy "
        f"machine. One lab takes seconds: {grade_command()} {lab_key(example)} "
        "(or a whole phase: phase-05)"
    )


def run(args: argparse.Namespace) -> int:
    if args.submission is not None:
        if args.impl == "ref":
            raise UserError("--submission grades a student's files: leave out --impl ref")
        if not args.submission.is_dir():
            raise UserError(f"--submission {args.submission}: not a directory")
    if args.results_json is not None:
        try:
            args.results_json.parent.mkdir(parents=True, exist_ok=True)
            args.results_json.touch()
        except OSError as exc:
            where = args.results_json
            raise UserError(f"--results-json {where}: cannot write there ({exc})") from None
    labs = select_labs(args.labs)
    if not args.labs and len(labs) > 1:
        print(all_labs_notice(len(labs), labs[0]), file=sys.stderr, flush=True)
    results: list[TestResult] = []
    began = time.perf_counter()
    for i, lab in enumerate(labs, 1):
        print(f"[{i}/{len(labs)}] {lab_key(lab)} ...", file=sys.stderr, end="", flush=True)
        start = time.perf_counter()
        mine = run_lab(lab, args.impl, args.submission)
        passed = sum(r.outcome == "passed" for r in mine)
        seconds = time.perf_counter() - start
        left = (time.perf_counter() - began) / i * (len(labs) - i)
        eta = f", about {left:.0f} s to go" if i < len(labs) else ""
        print(f" {passed}/{len(mine)} passed in {seconds:.0f} s{eta}", file=sys.stderr, flush=True)
        results += mine
    print(format_table(results))
    if len(labs) > 1:
        print(f"one lab, step by step: {grade_command()} {lab_key(labs[0])}", file=sys.stderr)
    if args.results_json is not None:
        args.results_json.write_text(json.dumps(gradescope_results(results), indent=1) + "\n")
        print(f"wrote {args.results_json}", file=sys.stderr)
    return 0
