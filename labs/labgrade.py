"""A pytest plugin that writes each lab test's step and outcome to a JSON file, for grading.

`python -m mini_vllm grade` runs a lab's tests with `-p labgrade` and the environment
variable MINI_VLLM_GRADE_REPORT naming the file. A test's step is its `stepN` marker
(every lab test has exactly one; the lab's README gives each step's command).
"""

from __future__ import annotations

import json
import os
import re

REPORT_VAR = "MINI_VLLM_GRADE_REPORT"
_STEP = re.compile(r"step(\d+)$")
_results: dict[str, dict] = {}


def step_of(item) -> int | None:
    steps = [int(m.group(1)) for mark in item.iter_markers() if (m := _STEP.match(mark.name))]
    return min(steps) if steps else None


def pytest_collection_modifyitems(session, config, items) -> None:
    for item in items:
        _results[item.nodeid] = {
            "nodeid": item.nodeid,
            "name": item.name,
            "step": step_of(item),
            "outcome": "not run",
            "output": "",
        }


def pytest_runtest_logreport(report) -> None:
    entry = _results.get(report.nodeid)
    if entry is None:
        return
    if report.failed:
        entry["outcome"] = "failed" if report.when == "call" else "error"
        entry["output"] = (report.longreprtext or "")[-2000:]
    elif report.skipped and entry["outcome"] == "not run":
        entry["outcome"] = "skipped"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        entry["output"] = reason
    elif report.when == "call" and report.passed and entry["outcome"] == "not run":
        entry["outcome"] = "passed"


def pytest_sessionfinish(session, exitstatus) -> None:
    path = os.environ.get(REPORT_VAR)
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(list(_results.values()), f, indent=1)
