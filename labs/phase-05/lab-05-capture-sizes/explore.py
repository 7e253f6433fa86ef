"""Run the README's scenarios on your code, beside your predictions: `python explore.py`.

Run it from this folder once a step's tests pass. For every question of predictions.py it
prints what your code gives and what you predicted; where they differ, one of the two is
wrong, and the step's tests say whether it is your code.
"""

from __future__ import annotations

import capture_sizes as mine
import predictions

TRACE_Q = {3: 40, 5: 30, 9: 20, 12: 10}  # decode batches of 3 to 12 requests: {size: steps}
POWERS_OF_TWO = [1, 2, 4, 8, 16, 32]


def show(name: str, compute) -> None:
    predicted = getattr(predictions, name, None)
    try:
        value = compute()
    except NotImplementedError:
        print(f"  {name:32} your code: (not written yet)   you predicted: {predicted!r}")
        return
    except Exception as exc:  # a bug of a step in progress: say so, go on with the others
        print(f"  {name:32} your code raised {type(exc).__name__}: {exc}")
        return
    if isinstance(value, float):
        value = round(value, 4)
    print(f"  {name:32} your code: {value!r:<12} you predicted: {predicted!r}")


def ladder(max_num_seqs: int, budget: int = 8192) -> list[int]:
    return mine.default_capture_sizes(max_num_seqs, budget)


def main() -> None:
    print("Before step 1: the default ladder")
    show("S1_NUM_SIZES_256_SEQS", lambda: len(ladder(256)))
    show("S1_TOP_RUNG_130_SEQS", lambda: ladder(130)[-1])
    show("S1_TOP_RUNG_BUDGET_20", lambda: ladder(256, budget=20)[-1])

    print("\nBefore step 3: the rung lookup")
    show("S3_RUNG_OF_33", lambda: mine.padded_size(33, ladder(256)))
    show("S3_RUNG_OF_257", lambda: mine.padded_size(257, ladder(256)))
    show("S3_258_HAS_A_GRAPH_AT_130_SEQS", lambda: mine.padded_size(258, ladder(130)) is not None)

    print("\nBefore step 4: padding on trace Q and on one step of 33")
    show(
        "S4_PADDING_DEFAULT_LADDER",
        lambda: mine.padding_waste(TRACE_Q, ladder(256)).padding_tokens,
    )
    show(
        "S4_PADDING_POWERS_OF_TWO",
        lambda: mine.padding_waste(TRACE_Q, POWERS_OF_TWO).padding_tokens,
    )
    show("S4_WASTE_OF_33", lambda: mine.padding_waste([33], ladder(256)).waste)

    print("\nFor the questions (no prediction graded):")
    try:
        for name, rungs in (("default", ladder(256)), ("powers of two", POWERS_OF_TWO)):
            cost = mine.ladder_cost(TRACE_Q, rungs, 0.5, 20.0)
            print(
                f"  {name:14} {cost.num_graphs:3} graphs, {cost.capture_seconds:5.1f} s, "
                f"{cost.graph_memory_mib:6.0f} MiB, waste {cost.padding.waste:.1%}"
            )
    except NotImplementedError:
        print("  ladder_cost: not written yet")


if __name__ == "__main__":
    main()
