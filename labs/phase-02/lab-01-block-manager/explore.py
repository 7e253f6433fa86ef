"""Run the README's prediction scenarios on your code, beside your predictions.

Run it from this folder: `python explore.py`. It plays the step 3 scenario and the two
step 5 scenarios through your `BlockManager` and prints what your code gives next to what
you predicted in predictions.py. Where they differ, one of the two is wrong: the step's
tests say whether it is your code.
"""

from __future__ import annotations

import block_manager as mine
import predictions

from mini_vllm.engine.sequence import Sequence


def attempt(what, compute):
    """`compute()`, or None after saying why it could not run."""
    try:
        return compute()
    except NotImplementedError as exc:
        print(f"  {what}: not written yet ({exc})")
    except Exception as exc:  # a bug of a step in progress: say so, go on
        print(f"  {what} raised {type(exc).__name__}: {exc}")
    return None


def step3() -> dict[str, object]:
    """A pool of 5 blocks of 4. a (10-token prompt) computes a first chunk of 5 tokens,
    then 3 more; b (8 tokens) is admitted whole; a finishes its prompt, then decodes
    one token a step for as long as it gets a slot."""
    bm = mine.BlockManager(5, 4)
    a = Sequence("a", range(10))
    bm.allocate(a, 5)
    a.num_computed_tokens = 5
    bm.append_slots(a, 3)
    a.num_computed_tokens = 8
    found: dict[str, object] = {"S3_BLOCKS_AT_8": len(a.block_table)}
    print(f"  a at 8 computed tokens: table {a.block_table}, {bm.num_free_blocks} free")
    b = Sequence("b", range(8))
    bm.allocate(b, 8)
    b.num_computed_tokens = 8
    print(f"  b admitted: table {b.block_table}, {bm.num_free_blocks} free")
    found["S3_CAN_FINISH_PROMPT"] = bm.can_append(a, 2)
    bm.append_slots(a, 2)
    a.num_computed_tokens = 10
    print(f"  a's prompt done: table {a.block_table}, {bm.num_free_blocks} free")
    for _ in range(20):
        a.append_token(7)
        if not bm.can_append(a, 1):
            found["S3_FIRST_REFUSED_POSITION"] = a.num_computed_tokens
            print(f"  a's decode at position {a.num_computed_tokens}: refused")
            break
        bm.append_slots(a, 1)
        print(f"  a's decode at position {a.num_computed_tokens}: table {a.block_table}")
        a.num_computed_tokens += 1
    return found


def admit_all(bm, seq):
    """Share what is cached, compute the rest, register the full blocks."""
    cached = bm.num_cached_tokens(seq)
    bm.allocate(seq, seq.num_tokens - cached, cached)
    seq.num_computed_tokens = seq.num_tokens
    bm.cache_full_blocks(seq)
    return seq


def step5() -> dict[str, object]:
    """Two scenarios, each on a pool of 4 blocks of 4 with prefix caching on."""
    found: dict[str, object] = {}
    bm = mine.BlockManager(4, 4, enable_prefix_caching=True)
    a = admit_all(bm, Sequence("a", [1, 2, 3, 4, 5, 6, 7, 8, 9]))
    print(f"  a = [1, ..., 9] admitted: table {a.block_table}")
    found["S5_B_CACHED_TOKENS"] = bm.num_cached_tokens(Sequence("b", [1, 2, 3, 4, 1, 2, 3, 4, 0]))
    found["S5_EIGHT_TOKENS_CACHED"] = bm.num_cached_tokens(Sequence("e", [1, 2, 3, 4, 5, 6, 7, 8]))
    bm = mine.BlockManager(4, 4, enable_prefix_caching=True)
    a = admit_all(bm, Sequence("a", range(13)))
    print(f"  a = [0, ..., 12] admitted on a fresh pool: table {a.block_table}, then freed")
    bm.free(a)
    x = admit_all(bm, Sequence("x", [50, 51, 52, 53, 54]))
    found["S5_X_TABLE"] = list(x.block_table)
    found["S5_A2_CACHED_TOKENS"] = bm.num_cached_tokens(Sequence("a2", range(13)))
    return found


def main() -> None:
    found: dict[str, object] = {}
    for name, scenario in (("step 3", step3), ("step 5", step5)):
        print(f"\n{name}:")
        found.update(attempt(name, scenario) or {})
    print("\nyour predictions beside your code:")
    for answer in (
        "S3_BLOCKS_AT_8",
        "S3_CAN_FINISH_PROMPT",
        "S3_FIRST_REFUSED_POSITION",
        "S5_B_CACHED_TOKENS",
        "S5_EIGHT_TOKENS_CACHED",
        "S5_X_TABLE",
        "S5_A2_CACHED_TOKENS",
    ):
        yours = repr(found[answer]) if answer in found else "(not run)"
        print(
            f"  {answer:26} your code: {yours:10} you predicted: {getattr(predictions, answer)!r}"
        )


if __name__ == "__main__":
    main()
