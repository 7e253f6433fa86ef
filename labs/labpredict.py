"""Predict, then check: grade a lab's predictions against what the reference computes.

Some labs ask, before a step's code, for a few predictions about a scenario (a number, a
list, yes or no, a choice among words), written into the lab's `predictions.py`, where
every answer starts as None. The lab's tests load that file as they load a starter:

    answers = implementation(
        __file__, starter="predictions.py", reference="tests.course.lab_checks.<lab>_answers"
    )

so `--impl=ref` reads the course's own answers instead. A step's prediction test builds
the question's scenario on the reference (mini_vllm, whichever implementation is chosen),
and compares:

    check_predictions(answers, {"TPOT_MS": reference_tpot_ms, "MEETS_ITL_SLO": False})

The test fails while any answer is None, and names the answers that differ from the
reference's without printing the true value: the lab's `explore.py` runs each scenario on
the student's own code and prints what it gives beside the prediction, which is how a
student checks (and then corrects) a prediction. Numbers are compared with a relative
tolerance (`rel`, 0.5% unless a truth says otherwise with `Approx`), so 15.9 passes for
15.85 but 16 does not; booleans, integers, words and lists exactly (words ignore case
and surrounding spaces; a list's numbers with the tolerance).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace

DEFAULT_REL = 5e-3


@dataclass(frozen=True)
class Approx:
    """A numeric truth with its own tolerance: `Approx(75.0, rel=0.01)`."""

    value: float
    rel: float = DEFAULT_REL
    abs: float = 1e-9


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def matches(answer: object, truth: object) -> bool:
    """Whether a prediction agrees with the reference's value."""
    if isinstance(truth, Approx):
        return _is_number(answer) and math.isclose(
            float(answer), truth.value, rel_tol=truth.rel, abs_tol=truth.abs
        )
    if isinstance(truth, bool):
        return isinstance(answer, bool) and answer is truth
    if isinstance(truth, int):
        return _is_number(answer) and float(answer) == truth
    if isinstance(truth, float):
        return matches(answer, Approx(truth))
    if isinstance(truth, str):
        return isinstance(answer, str) and answer.strip().lower() == truth.strip().lower()
    if isinstance(truth, (list, tuple)):
        return (
            isinstance(answer, (list, tuple))
            and len(answer) == len(truth)
            and all(matches(a, t) for a, t in zip(answer, truth))
        )
    return answer == truth


def unanswered(answers: ModuleType | SimpleNamespace, names) -> list[str]:
    return [name for name in names if getattr(answers, name, None) is None]


def check_predictions(answers: ModuleType | SimpleNamespace, truths: dict[str, object]) -> None:
    """Fail (AssertionError) unless every answer named in `truths` is given and right."""
    blank = unanswered(answers, truths)
    wrong = [
        f"{name} (yours: {getattr(answers, name)!r})"
        for name, truth in truths.items()
        if name not in blank and not matches(getattr(answers, name), truth)
    ]
    lines = []
    if blank:
        lines.append(
            "not predicted yet (still None in predictions.py): "
            + ", ".join(blank)
            + ". Predict before you write the step's code: the README gives each scenario."
        )
    if wrong:
        lines.append(
            "these predictions differ from what the reference computes: "
            + "; ".join(wrong)
            + ". Run `python explore.py` in the lab's folder once your code passes the "
            "step's other tests: it prints what your code gives beside each prediction. "
            "Work out why your prediction was off before you change it (the README's "
            "questions ask exactly that)."
        )
    assert not lines, "\n".join(lines)
