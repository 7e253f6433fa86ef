"""Run the README's questions on your code, beside your predictions: `python explore.py`.

Run it from this folder once a step's tests pass. It scores, serves and chooses ladders
for the README's trace G with your `evaluate_ladder`, `score_with_engine` and
`choose_ladder`, and prints what your code gives next to what you predicted in
predictions.py. Where they differ, one of the two is wrong: the step's tests say whether
it is your code.
"""

from __future__ import annotations

from collections import Counter

import ladder as mine
import predictions

G = {2: 3, 3: 3, 8: 3, 16: 9, 18: 4, 20: 5}  # size: steps; 27 steps, 355 tokens
G_STEPS = [size for size, steps in G.items() for _ in range(steps)]


def attempt(what, compute):
    """`compute()`, or None after saying why it could not run."""
    try:
        return compute()
    except NotImplementedError:
        print(f"  {what}: not written yet")
    except Exception as exc:  # a bug of a step in progress: say so, go on
        print(f"  {what} raised {type(exc).__name__}: {exc}")
    return None


def show(name: str, value) -> None:
    if isinstance(value, float):
        value = round(value, 4)
    yours = "(not run)" if value is None else repr(value)
    print(f"  {name:26} your code: {yours:12} you predicted: {getattr(predictions, name)!r}")


def step2() -> None:
    print("Before step 2: scoring a ladder on G")
    low = attempt("evaluate_ladder", lambda: mine.evaluate_ladder(G, [8, 16]))
    high = low and attempt("evaluate_ladder", lambda: mine.evaluate_ladder(G, [8, 16, 20]))
    for score in (low, high):
        if score is not None:
            print(f"  {score}")
    show("S2_HIT_RATE_8_16", low and low.hit_rate)
    show("S2_PADDING_8_16", low and low.padding_tokens)
    show("S2_PADDING_8_16_20", high and high.padding_tokens)


def step3() -> None:
    print("\nBefore step 3: G served with the ladder [4, 8, 18] and max_num_seqs 8")
    stats = attempt(
        "score_with_engine", lambda: mine.score_with_engine(G_STEPS, [4, 8, 18], max_num_seqs=8)
    )
    if stats is not None:
        seen = Counter((s.num_tokens, s.runtime_mode, s.num_padded_tokens) for s in stats.steps)
        for (size, mode, padded), steps in sorted(seen.items()):
            print(f"  {steps} steps of {size}: {mode} at {padded}")
    modes = Counter(s.runtime_mode for s in stats.steps) if stats else {}
    padded = {s.num_tokens: s.num_padded_tokens for s in stats.steps} if stats else {}
    show("S3_FULL_STEPS", modes.get("FULL", 0) if stats else None)
    show("S3_PIECEWISE_STEPS", modes.get("PIECEWISE", 0) if stats else None)
    show("S3_PADDED_SIZE_OF_20", padded.get(20))
    show("S3_ENGINE_HIT_RATE", stats and stats.decode_graph_hit_rate)


def step4() -> None:
    print("\nBefore step 4: choosing a ladder for G")
    best_100 = attempt("choose_ladder", lambda: mine.choose_ladder(G, 3, min_hit_rate=1.0))
    top_80 = best_100 and mine.choose_ladder(G, 1, min_hit_rate=0.8)
    best_80 = best_100 and mine.choose_ladder(G, 3, min_hit_rate=0.8)
    padding = best_100 and attempt("evaluate_ladder", lambda: mine.evaluate_ladder(G, best_100))
    show("S4_BEST_3_AT_100", best_100)
    show("S4_BEST_PADDING_3_AT_100", padding.padding_tokens if best_100 and padding else None)
    show("S4_TOP_RUNG_AT_80", top_80[-1] if top_80 else None)
    show("S4_BEST_3_AT_80", best_80)


def main() -> None:
    step2()
    step3()
    step4()


if __name__ == "__main__":
    main()
