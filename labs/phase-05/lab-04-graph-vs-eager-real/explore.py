"""Run the README's scenarios on your code, beside your predictions: `python explore.py`.

Run it from this folder once a step's tests pass. It times the steps E and G and the fake
engine's first calls with your `time_decode_steps` on the simulated GPU the tests use
(tests/lab04_scenarios.py), reads the article's table and the recorded H100 run with your
`saving_ms` and `crossover_batch`, and prints what your code gives beside what you
predicted in predictions.py. Where they differ, one of the two is wrong: the step's tests
say whether it is your code.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "tests"))

import graph_vs_eager as mine  # noqa: E402
import predictions  # noqa: E402
from lab04_scenarios import (  # noqa: E402
    ARTICLE,
    STEP_E,
    STEP_G,
    median_step_ms,
    readme_step1,
    readme_step2,
)


def attempt(what, compute):
    """`compute()`, or None after saying why it could not run."""
    try:
        return compute()
    except NotImplementedError:
        print(f"  {what}: not written yet")
    except Exception as exc:  # a bug of a step in progress: say so, go on
        print(f"  {what} raised {type(exc).__name__}: {exc}")
    return None


def show(pairs: list[tuple[str, str]], found: dict[str, object] | None) -> None:
    """One line a prediction: its name, what your code gives (found[key]), your answer."""
    for name, key in pairs:
        value = (found or {}).get(key)
        if isinstance(value, float):
            value = round(value, 4)
        yours = "(not run)" if found is None else repr(value)
        print(f"  {name:32} your code: {yours:10} you predicted: {getattr(predictions, name)!r}")


def rounded(table: dict[int, float]) -> dict[int, float]:
    return {batch: round(value, 3) for batch, value in table.items()}


def step1() -> dict[str, object]:
    timer = mine.time_decode_steps
    print(f"  step E on your timer: {median_step_ms(timer, STEP_E):.4f} ms")
    print(f"  step G on your timer: {median_step_ms(timer, STEP_G):.4f} ms")
    return readme_step1(timer)


def step2() -> dict[str, object]:
    article = [mine.ITLRow(*row) for row in ARTICLE]
    print(f"  the article's table, your speed-ups: {rounded(mine.speedups(article))}")
    print(f"  the article's table, your savings (ms): {rounded(mine.saving_ms(article))}")
    _, rows = mine.load_recorded(mine.RECORDED)
    print(f"  the recorded run, your speed-ups: {rounded(mine.speedups(rows))}")
    return readme_step2(mine, rows)


def main() -> None:
    print("Before step 1: timing the simulated steps E and G")
    found = attempt("step 1", step1)
    show(
        [
            ("S1_EAGER_MS", "eager_ms"),
            ("S1_GRAPH_MS", "graph_ms"),
            ("S1_GRAPH_MS_NO_SYNC", "graph_ms_no_sync"),
            ("S1_SPEEDUP_NO_SYNC", "speedup_no_sync"),
            ("S1_MEAN_FROM_FIRST_CALL_MS", "mean_from_first_call_ms"),
        ],
        found,
    )
    print("\nBefore step 2: reading a table of eager and graph steps")
    found = attempt("step 2", step2)
    show(
        [
            ("S2_ARTICLE_SAVING_MS_BATCH_32", "article_saving_ms_batch_32"),
            ("S2_ARTICLE_CROSSOVER_AT_1_30", "article_crossover_at_1_30"),
            ("S2_RECORDED_CROSSOVER_AT_6", "recorded_crossover_at_6"),
        ],
        found,
    )


if __name__ == "__main__":
    main()
