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
    """A pool of 5 blocks of 4. a (8-token prompt) is computed whole and samples a token;
    b (7 tokens) likewise; the next step computes both sampled tokens if the pool lets it;
    then a alone makes room, computes and samples, one token a step, while it can."""
    bm = mine.BlockManager(5, 4)
    a = Sequence("a", range(8))
    bm.allocate(a, 8)
    a.num_computed_tokens = 8
    a.append_token(7)
    found: dict[str, object] = {"S3_BLOCKS_AFTER_PROMPT": len(a.block_table)}
    print(f"  a's prompt step done, 9 tokens: table {a.block_table}, {bm.num_free_blocks} free")
    b = Sequence("b", range(7))
    bm.allocate(b, 7)
    b.num_computed_tokens = 7
    b.append_token(7)
    print(f"  b's prompt step done: table {b.block_table}, {bm.num_free_blocks} free")
    both = bm.can_append(a, 1)
    if both:
        bm.append_slots(a, 1)
        a.num_computed_tokens += 1
        a.append_token(7)
        both = bm.can_append(b, 1)
        if both:
            bm.append_slots(b, 1)
            b.num_computed_tokens += 1
            b.append_token(7)
    found["S3_BOTH_DECODE"] = both
    print(f"  next step: a {a.block_table}, b {b.block_table}, {bm.num_free_blocks} free")
    for _ in range(100):
        if not bm.can_append(a, 1):
            print(f"  a refused at position {a.num_computed_tokens}, {a.num_tokens} tokens")
            break
        bm.append_slots(a, 1)
        a.num_computed_tokens += 1
        a.append_token(7)
        print(f"  a computed position {a.num_computed_tokens - 1}: table {a.block_table}")
    found["S3_TOKENS_SAMPLED"] = a.num_tokens - 8
    return found


def admit_all(bm, seq):
    """Share what is cached, compute the rest, register the full blocks."""
    cached = bm.num_cached_tokens(seq)
    bm.allocate(seq, seq.num_tokens - cached, cached)
    seq.num_computed_tokens = seq.num_tokens
    bm.cache_full_blocks(seq)
    return seq


def step5() -> dict[str, object]:
    """Two scenarios, each on a fresh pool of 6 blocks of 4 with prefix caching on."""
    found: dict[str, object] = {}
    bm = mine.BlockManager(6, 4, enable_prefix_caching=True)
    a = admit_all(bm, Sequence("a", [1, 2, 3, 4, 5, 6, 7, 8, 9]))
    print(f"  a = [1, ..., 9] admitted: table {a.block_table}, then freed")
    bm.free(a)
    found["S5_EIGHT_TOKENS_CACHED"] = bm.num_cached_tokens(Sequence("e", [1, 2, 3, 4, 5, 6, 7, 8]))
    b = admit_all(bm, Sequence("b", [1, 2, 3, 4, 5, 6, 7, 8, 9]))
    found["S5_B_TABLE"] = list(b.block_table)
    found["S5_FREE_AFTER_B"] = bm.num_free_blocks
    print(f"  b admitted: table {b.block_table}, {bm.num_free_blocks} free")
    bm = mine.BlockManager(6, 4, enable_prefix_caching=True)
    d = admit_all(bm, Sequence("d", [1, 2, 3, 4, 5, 6]))
    d.append_token(7)
    bm.append_slots(d, 1)
    d.num_computed_tokens += 1
    bm.cache_full_blocks(d)
    d.append_token(8)
    print(f"  d after one decode: tokens {list(d.token_ids)}, {d.num_computed_tokens} computed")
    found["S5_AFTER_DECODE_CACHED"] = bm.num_cached_tokens(
        Sequence("p", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    )
    return found


def main() -> None:
    found: dict[str, object] = {}
    for name, scenario in (("step 3", step3), ("step 5", step5)):
        print(f"\n{name}:")
        found.update(attempt(name, scenario) or {})
    print("\nyour predictions beside your code:")
    for answer in (
        "S3_BLOCKS_AFTER_PROMPT",
        "S3_BOTH_DECODE",
        "S3_TOKENS_SAMPLED",
        "S5_EIGHT_TOKENS_CACHED",
        "S5_B_TABLE",
        "S5_FREE_AFTER_B",
        "S5_AFTER_DECODE_CACHED",
    ):
        yours = repr(found[answer]) if answer in found else "(not run)"
        print(
            f"  {answer:26} your code: {yours:10} you predicted: {getattr(predictions, answer)!r}"
        )


if __name__ == "__main__":
    main()
