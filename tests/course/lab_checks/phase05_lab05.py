"""Phase 05, lab 05 (the capture-size ladder): the mistakes its tests must catch, and the
reference functions each step asks for."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "labs"))
from mutation import Mutant

SIZES = "mini_vllm.config.capture_sizes"

STEPS = {
    1: [f"{SIZES}:default_capture_sizes"],
    2: [f"{SIZES}:normalize_capture_sizes"],
    3: [f"{SIZES}:padded_size"],
    4: [f"{SIZES}:padding_waste"],
    5: [f"{SIZES}:ladder_cost"],
}

MUTANTS = [
    Mutant(
        name="max_num_seqs not doubled",
        mistake="the largest rung is min(max_num_seqs, 512, budget), forgetting that vLLM "
        "captures up to twice max_num_seqs",
        module=SIZES,
        old="largest = min(max_num_seqs * 2, 512, max_num_batched_tokens)",
        new="largest = min(max_num_seqs, 512, max_num_batched_tokens)",
    ),
    Mutant(
        name="ladder not clipped to the token budget",
        mistake="the default ladder ignores max_num_batched_tokens and captures sizes no "
        "batch can reach",
        module=SIZES,
        old="largest = min(max_num_seqs * 2, 512, max_num_batched_tokens)",
        new="largest = min(max_num_seqs * 2, 512)",
    ),
    Mutant(
        name="1, 2, 4 unfiltered",
        mistake="the small sizes 1, 2 and 4 are always added, even above the largest rung",
        module=SIZES,
        old="sizes = [s for s in (1, 2, 4) if s <= largest]",
        new="sizes = [1, 2, 4]",
    ),
    Mutant(
        name="every 8 all the way up",
        mistake="the step of 8 runs to the largest rung instead of stopping below 256, so "
        "the ladder from 256 on is doubled",
        module=SIZES,
        old="range(8, min(largest + 1, 256), 8)",
        new="range(8, largest + 1, 8)",
    ),
    Mutant(
        name="user ladder kept in the user's order",
        mistake="a user's ladder is de-duplicated but not sorted, so the rung lookup searches "
        "an unsorted list",
        module=SIZES,
        old="kept = sorted({s for s in sizes if s <= max_num_batched_tokens})",
        new="kept = list(dict.fromkeys(s for s in sizes if s <= max_num_batched_tokens))",
    ),
    Mutant(
        name="budget-sized rung dropped",
        mistake="a size equal to max_num_batched_tokens is dropped (< instead of <=), though "
        "a batch can hold exactly that many tokens",
        module=SIZES,
        old="kept = sorted({s for s in sizes if s <= max_num_batched_tokens})",
        new="kept = sorted({s for s in sizes if s < max_num_batched_tokens})",
    ),
    Mutant(
        name="rung lookup with bisect_right",
        mistake="bisect_right finds the first size strictly above the batch, so a batch that "
        "is exactly a capture size is padded to the next one",
        module=SIZES,
        old="index = bisect.bisect_left(capture_sizes, num_tokens)",
        new="index = bisect.bisect_right(capture_sizes, num_tokens)",
    ),
    Mutant(
        name="above the ladder clamped to the top rung",
        mistake="a batch above the ladder is given the largest rung instead of None (it "
        "would be truncated, or crash, instead of running eagerly)",
        module=SIZES,
        old="return capture_sizes[index] if index < len(capture_sizes) else None",
        new="return capture_sizes[min(index, len(capture_sizes) - 1)] if capture_sizes else None",
    ),
    Mutant(
        name="eager steps' tokens not counted",
        mistake="real_tokens counts only the batches that replayed a graph, so the waste of a "
        "trace with misses looks larger than it is",
        module=SIZES,
        old="real += size * count\n        if rung is None:\n            misses += count\n"
        "        else:\n",
        new="if rung is None:\n            misses += count\n        else:\n"
        "            real += size * count\n",
    ),
    Mutant(
        name="histogram counts ignored",
        mistake="each distinct batch size is counted once, ignoring how many steps had it",
        module=SIZES,
        old="padding += (rung - size) * count",
        new="padding += rung - size",
    ),
    Mutant(
        name="graphs counted only where the trace lands",
        mistake="the ladder's cost counts only the rungs the trace uses, but the engine "
        "captures every rung at start-up",
        module=SIZES,
        old="n = len(capture_sizes)",
        new="n = len({padded_size(b, capture_sizes) for b in _as_histogram(batch_sizes)} - {None})",
    ),
]

MUTANTS += [
    Mutant(
        name="the top rung runs eagerly",
        mistake="padded_size checks 'above the ladder' with >= the largest rung, so a batch of "
        "exactly the largest capture size runs eagerly instead of replaying its graph",
        module=SIZES,
        old="index = bisect.bisect_left(capture_sizes, num_tokens)",
        new="if capture_sizes and num_tokens >= capture_sizes[-1]:\n        return None\n"
        "    index = bisect.bisect_left(capture_sizes, num_tokens)",
    ),
    Mutant(
        name="the caller's list sorted in place",
        mistake="normalize_capture_sizes sorts the list it was given (sizes.sort()), so the "
        "caller's own list comes back reordered",
        module=SIZES,
        old="    sizes = list(sizes)\n",
        new="    sizes = sizes if isinstance(sizes, list) else list(sizes)\n    sizes.sort()\n",
    ),
    Mutant(
        name="an iterator read twice",
        mistake="normalize_capture_sizes validates the sizes and then filters them, reading an "
        "iterator twice: the second pass finds it empty",
        module=SIZES,
        old="    sizes = list(sizes)\n",
        new="",
    ),
    Mutant(
        name="a free graph refused",
        mistake="ladder_cost refuses a per-graph cost of zero (<= 0 instead of < 0), though a "
        "cost left out of the comparison is zero",
        module=SIZES,
        old="if capture_seconds_per_graph < 0 or memory_mib_per_graph < 0:",
        new="if capture_seconds_per_graph <= 0 or memory_mib_per_graph <= 0:",
    ),
    Mutant(
        name="the largest size always a rung",
        mistake="the default ladder ends on min(2 * max_num_seqs, 512, budget) even when that "
        "size is off the grid of 8s and 16s (260 for max_num_seqs=130)",
        module=SIZES,
        old="    sizes += list(range(256, largest + 1, 16))\n",
        new="    sizes += list(range(256, largest + 1, 16))\n"
        "    sizes += [] if largest in sizes else [largest]\n",
    ),
    Mutant(
        name="distinct sizes counted as steps",
        mistake="graph_steps counts each distinct batch size once, not the steps that had it",
        module=SIZES,
        old="hits += count",
        new="hits += 1",
    ),
    Mutant(
        name="the small sizes stop below the largest",
        mistake="the sizes 1, 2 and 4 are kept only below the largest size (< instead of <=), "
        "so a ladder whose largest size is 4 loses it",
        module=SIZES,
        old="sizes = [s for s in (1, 2, 4) if s <= largest]",
        new="sizes = [s for s in (1, 2, 4) if s < largest]",
    ),
]
