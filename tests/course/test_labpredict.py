"""Predict, then check (labs/labpredict.py): how a prediction is graded, and what every lab
with a `predictions.py` must hold to.

A lab that asks for predictions keeps them in `predictions.py` (every answer None), grades
them with a test per step that loads the file through `implementation(...)` with the
course's answers as its reference (so `--impl=ref` and `mini_vllm grade` on the reference
see the answers), and ships an `explore.py` that runs the questions on the student's code.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "labs"))
from labpredict import Approx, check_predictions, matches  # noqa: E402

LABS_WITH_PREDICTIONS = sorted(
    p.parent for p in (ROOT / "labs").glob("phase-*/lab-*/predictions.py") if p.is_file()
)
IDS = [f"{lab.parent.name}/{lab.name}" for lab in LABS_WITH_PREDICTIONS]


# --- grading one answer ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "truth", "ok"),
    [
        (15.85, 15.85, True),
        (15.9, 15.85, True),  # within 0.5%
        (16, 15.85, False),  # nearest rank: not the interpolated value
        (87.5, 87.5000000001, True),
        (3, 3, True),
        (3.0, 3, True),
        (3.5, 3, False),
        (True, True, True),
        (1, True, False),  # a number is not a yes
        (True, 1, False),  # and a yes is not a number
        (False, False, True),
        ("Middle ", "middle", True),
        ("first", "middle", False),
        ([6, 5, 6], [6, 5, 6], True),
        ((6, 5, 6), [6, 5, 6], True),
        ([6, 5], [6, 5, 6], False),
        ([0.06, 0.09], [0.0600001, 0.09], True),
        ("4", 4, False),
        (None, 4, False),
    ],
)
def test_an_answer_matches_the_truth_by_its_kind(answer, truth, ok):
    assert matches(answer, truth) is ok


def test_a_truth_may_carry_its_own_tolerance():
    assert matches(1.55, Approx(1.5, rel=0.05))
    assert not matches(1.55, Approx(1.5))  # 3% off: beyond the default 0.5%
    assert not matches(True, Approx(1.0))


def test_a_blank_or_wrong_prediction_fails_without_giving_the_answer_away():
    truths = {"TPOT_MS": 87.5, "GOOD": False, "ROWS": [9, 12, 0, 0]}
    answers = SimpleNamespace(TPOT_MS=80.0, GOOD=None, ROWS=[9, 12, 0, 0])
    with pytest.raises(AssertionError) as failed:
        check_predictions(answers, truths)
    message = str(failed.value)
    assert "GOOD" in message.split("not predicted yet")[1].split("\n")[0]
    assert "TPOT_MS (yours: 80.0)" in message
    assert "87.5" not in message and "ROWS" not in message
    assert "explore.py" in message


def test_right_predictions_pass():
    check_predictions(SimpleNamespace(A=1.5, B=True), {"A": 1.5, "B": True})


def test_a_missing_name_counts_as_not_predicted():
    with pytest.raises(AssertionError, match="not predicted yet.*MISSING"):
        check_predictions(SimpleNamespace(), {"MISSING": 1})


# --- every lab that asks for predictions ------------------------------------------------


def assigned_names(path: Path) -> dict[str, object]:
    """{NAME: value} of a file's top-level `NAME = literal` lines."""
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id.isupper():
                found[target.id] = ast.literal_eval(node.value)
    return found


def answers_module(lab: Path) -> str:
    """The reference the lab's tests give predictions.py, read from their
    `implementation(...)` call."""
    for test_file in sorted((lab / "tests").glob("test_*.py")):
        for node in ast.walk(ast.parse(test_file.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "implementation":
                kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
                if kwargs.get("starter") == "predictions.py":
                    return kwargs["reference"]
    pytest.fail(
        f"{lab.name}'s tests never load predictions.py with implementation(__file__, "
        "starter='predictions.py', reference=...): --impl=ref and grade could not see answers"
    )


def test_labs_with_predictions_are_found():
    assert len(LABS_WITH_PREDICTIONS) >= 3


@pytest.mark.parametrize("lab", LABS_WITH_PREDICTIONS, ids=IDS)
def test_the_predictions_file_starts_blank_and_the_answers_give_every_name(lab: Path):
    blank = assigned_names(lab / "predictions.py")
    assert blank, f"{lab.name}/predictions.py asks nothing"
    filled = [name for name, value in blank.items() if value is not None]
    assert not filled, f"{lab.name}/predictions.py gives answers away: {filled}"
    module = answers_module(lab)
    path = ROOT / (module.replace(".", "/") + ".py")
    assert path.exists(), f"{lab.name}: no answers file {path.relative_to(ROOT)}"
    answers = assigned_names(path)
    assert set(answers) == set(blank), (
        f"{path.name} and {lab.name}/predictions.py name different questions: "
        f"{sorted(set(answers) ^ set(blank))}"
    )
    assert all(value is not None for value in answers.values())


@pytest.mark.parametrize("lab", LABS_WITH_PREDICTIONS, ids=IDS)
def test_every_prediction_is_asked_graded_and_explored(lab: Path):
    names = set(assigned_names(lab / "predictions.py"))
    readme = (lab / "README.md").read_text()
    tests = "\n".join(p.read_text() for p in (lab / "tests").glob("test_*.py"))
    explore = lab / "explore.py"
    assert explore.exists(), f"{lab.name} has no explore.py to check the predictions with"
    for name in sorted(names):
        assert f"`{name}`" in readme, f"{lab.name}/README.md does not ask for `{name}`"
        assert re.search(rf"[\"']{name}[\"']", tests), f"no test of {lab.name} grades {name}"
        assert name in explore.read_text(), f"{lab.name}/explore.py does not show {name}"
    assert "python explore.py" in readme
    assert re.search(r"def test_your_step\d+_predictions", tests)
