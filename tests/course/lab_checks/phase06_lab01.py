"""Phase 06, lab 01 (capture ladder): the mistakes students make, and the lab's steps."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "labs"))
from mutation import Mutant

MODULE = "mini_vllm.bench.ladder"

MUTANTS = [
    Mutant(
        name="trace keeps mixed steps",
        mistake="the trace takes every step's size, mixed steps with a prefill included, "
        "though the decode graph hit rate is measured on uniform-decode steps only",
        module=MODULE,
        old="return [s.num_tokens for s in stats.steps if s.uniform_decode]",
        new="return [s.num_tokens for s in stats.steps]",
    ),
    Mutant(
        name="trace of padded sizes",
        mistake="the trace records each step's padded size (the rung it ran at under the "
        "ladder of the recorded run) instead of its real batch size",
        module=MODULE,
        old="return [s.num_tokens for s in stats.steps if s.uniform_decode]",
        new="return [s.num_padded_tokens for s in stats.steps if s.uniform_decode]",
    ),
    Mutant(
        name="misses left out of the step count",
        mistake="the score counts only the steps that hit a graph as decode steps, so the "
        "hit rate is always 100%",
        module=MODULE,
        old="decode_steps=report.graph_steps + report.eager_steps,",
        new="decode_steps=report.graph_steps,",
    ),
    Mutant(
        name="ladder kept as given",
        mistake="the score keeps the ladder in the order given, duplicates and all, "
        "instead of sorted and de-duplicated",
        module=MODULE,
        old="    return tuple(sorted(set(rungs)))",
        new="    return tuple(rungs)",
    ),
    Mutant(
        name="engine record unpadded",
        mistake="each StepRecord's padded size is the batch size itself instead of the "
        "dispatcher's descriptor, so the engine's statistics show no padding",
        module=MODULE,
        old="num_padded_tokens=descriptor.num_tokens,",
        new="num_padded_tokens=size,",
    ),
    Mutant(
        name="dispatched as a mixed batch",
        mistake="the trace is dispatched with uniform_decode=False, so decode steps go to "
        "the PIECEWISE graphs instead of the FULL ones",
        module=MODULE,
        old="dispatcher.dispatch(size, uniform_decode=True)",
        new="dispatcher.dispatch(size, uniform_decode=False)",
    ),
    Mutant(
        name="max_num_seqs from the trace alone",
        mistake="without max_num_seqs, the dispatcher is built with the trace's largest "
        "batch, so rungs above it get no FULL graph",
        module=MODULE,
        old="max_num_seqs = max(sizes + rungs, default=1)",
        new="max_num_seqs = max(sizes, default=1)",
    ),
    Mutant(
        name="strict hit-rate threshold",
        mistake="the top rung must exceed the hit-rate target (>) instead of reaching it "
        "(>=), so a trace that reaches it exactly gets a top rung one size too high",
        module=MODULE,
        old="if covered >= min_hit_rate * total - 1e-9:",
        new="if covered > min_hit_rate * total:",
    ),
    Mutant(
        name="top rung one size early",
        mistake="the top rung is the last size whose cumulative share is still below the "
        "target (the loop stops one rung early), so the hit rate falls short",
        module=MODULE,
        old="            top = i\n            break",
        new="            top = max(i - 1, 0)\n            break",
    ),
    Mutant(
        name="top rung checked before adding its steps",
        mistake="the loop tests the cumulative share before adding the current size's "
        "steps, so the top rung lands one size above the smallest that reaches the target",
        module=MODULE,
        old="        covered += counts[size]\n"
        "        if covered >= min_hit_rate * total - 1e-9:\n"
        "            top = i\n"
        "            break",
        new="        if covered >= min_hit_rate * total - 1e-9:\n"
        "            top = i\n"
        "            break\n"
        "        covered += counts[size]",
    ),
    Mutant(
        name="capture-size bound off by one",
        mistake="a top rung equal to max_capture_size is refused (>= where > is meant)",
        module=MODULE,
        old="if max_capture_size is not None and sizes[top] > max_capture_size:",
        new="if max_capture_size is not None and sizes[top] >= max_capture_size:",
    ),
    Mutant(
        name="segment counts the rung below",
        mistake="the padding of a segment starts at the rung below (pad(j, i) instead of "
        "pad(j + 1, i)), charging that rung's steps twice",
        module=MODULE,
        old="cost = best[k - 1][j] + pad(j + 1, i)",
        new="cost = best[k - 1][j] + pad(j, i)",
    ),
    Mutant(
        name="walk back stops one rung early",
        mistake="walking the chosen rungs back from the top stops before the lowest one, "
        "so the ladder has one rung fewer than the plan it was scored for",
        module=MODULE,
        old="while k >= 1 and i >= 0:",
        new="while k > 1 and i >= 0:",
    ),
    Mutant(
        name="fewest graphs first",
        mistake="among the rung counts the plan allows, the chooser prefers the fewest "
        "graphs and only then the least padding, so extra graphs are never used",
        module=MODULE,
        old="key=lambda n: (best[n][m - 1], n)",
        new="key=lambda n: (n, best[n][m - 1])",
    ),
    Mutant(
        name="greedy rungs",
        mistake="the rungs below the top are placed greedily (each new rung where it saves "
        "most padding now) instead of by dynamic programming",
        module=MODULE,
        old="    k = min(\n        range(1, k_max + 1), key=lambda n: (best[n][m - 1], n)\n"
        "    )  # least padding, then fewest graphs\n"
        "    ladder, i = [], m - 1\n"
        "    while k >= 1 and i >= 0:\n"
        "        ladder.append(sizes[i])\n"
        "        i, k = prev[k][i], k - 1\n"
        "    return sorted(ladder)",
        new="    chosen = {m - 1}\n"
        "\n"
        "    def total_pad(rungs):\n"
        "        ordered, lo, cost = sorted(rungs), 0, 0\n"
        "        for r in ordered:\n"
        "            cost += pad(lo, r)\n"
        "            lo = r + 1\n"
        "        return cost\n"
        "\n"
        "    while len(chosen) < k_max:\n"
        "        gains = [(total_pad(chosen | {c}), c) for c in range(m) if c not in chosen]\n"
        "        cost, c = min(gains)\n"
        "        if cost >= total_pad(chosen):\n"
        "            break\n"
        "        chosen.add(c)\n"
        "    return [sizes[c] for c in sorted(chosen)]",
    ),
]

MUTANTS += [
    Mutant(
        name="the caller's ladder sorted in place",
        mistake="the ladder is sorted in the caller's own list (ladder.sort()) instead of "
        "a copy, so scoring a ladder reorders the list the caller keeps",
        module=MODULE,
        old="    rungs = list(ladder)\n",
        new="    rungs = ladder if isinstance(ladder, list) else list(ladder)\n    rungs.sort()\n",
    ),
    Mutant(
        name="ladder read twice",
        mistake="the ladder is walked once to check the rungs and again to sort them, so a "
        "ladder given as a generator comes out empty",
        module=MODULE,
        old="    rungs = list(ladder)\n",
        new="    rungs = ladder\n",
    ),
    Mutant(
        name="padded by the rung lookup, not the dispatcher",
        mistake="the engine's step records take the padded size from the rung lookup "
        "instead of the dispatcher's descriptor, so a step the dispatcher runs eagerly "
        "(graphs off, or above max_num_seqs under FULL_DECODE_ONLY) is recorded as padded",
        module=MODULE,
        old="num_padded_tokens=descriptor.num_tokens,",
        new="num_padded_tokens=next((r for r in rungs if r >= size), size),",
    ),
    Mutant(
        name="hit-rate target compared in floats",
        mistake="the steps so far are compared with min_hit_rate * total steps in floating "
        "point, so a target met exactly (7 steps of 100 at 0.07, where 0.07 * 100 is "
        "7.000000000000001) is missed and the top rung lands one size too high",
        module=MODULE,
        old="if covered >= min_hit_rate * total - 1e-9:",
        new="if covered >= min_hit_rate * total:",
    ),
    Mutant(
        name="a hit rate of 0 refused",
        mistake="min_hit_rate is checked as 0 < rate <= 1, so the lower end of the range, "
        "which the docstring allows, is an error",
        module=MODULE,
        old="if not 0.0 <= min_hit_rate <= 1.0:",
        new="if not 0.0 < min_hit_rate <= 1.0:",
    ),
]

STEPS = {
    1: [f"{MODULE}:trace_from_stats"],
    2: [f"{MODULE}:evaluate_ladder"],
    3: [f"{MODULE}:score_with_engine"],
    4: [f"{MODULE}:choose_ladder"],
}
