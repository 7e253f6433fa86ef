"""Phase 02, lab 01 (the block manager): the mistakes its tests must catch, and its steps.

Some mistakes are made in two places of the module at once (a student who does not chain
the keys leaves the chain out where blocks are registered and where they are looked up);
`_in_two_places` turns such a pair of changes into one `Mutant` over the text between them.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "labs"))
from mutation import Mutant

MODULE = "mini_vllm.engine.block_manager"
SOURCE = pathlib.Path(__file__).resolve().parents[3] / "mini_vllm" / "engine" / "block_manager.py"


def _in_two_places(first: tuple[str, str], second: tuple[str, str]) -> dict[str, str]:
    """old/new for one mistake made at two places: the source from the start of
    `first`'s old text to the end of `second`'s, with both changed."""
    source = SOURCE.read_text(encoding="utf-8")
    for old, _ in (first, second):
        if source.count(old) != 1:
            raise ValueError(f"{old!r} occurs {source.count(old)} times in {MODULE}")
    start = source.index(first[0])
    end = source.index(second[0]) + len(second[0])
    if start >= end - len(second[0]):
        raise ValueError("the first change must come before the second")
    old = source[start:end]
    new = first[1] + old[len(first[0]) : -len(second[0])] + second[1]
    return {"old": old, "new": new}


MUTANTS = [
    # -- step 1 ----------------------------------------------------------------------
    Mutant(
        name="slot from the logical block index",
        mistake="slot_of multiplies the position's index in the table (p // block_size) by "
        "block_size instead of the physical block id stored at that index",
        module=MODULE,
        old="return block_table[block_index] * block_size + offset",
        new="return block_index * block_size + offset",
    ),
    Mutant(
        name="negative position wraps around",
        mistake="slot_of checks only the upper end, so position -1 silently maps to the last "
        "slot of the table's last block",
        module=MODULE,
        old="if position < 0 or block_index >= len(block_table):",
        new="if block_index >= len(block_table):",
    ),
    Mutant(
        name="blocks needed is floor plus one",
        mistake="blocks_needed computes num_tokens // block_size + 1, one block too many for an "
        "exact multiple of the block size (and 1 block for 0 tokens)",
        module=MODULE,
        old="return -(-a // b)",
        new="return a // b + 1",
    ),
    Mutant(
        name="blocks needed through a float",
        mistake="blocks_needed rounds a float division up (math.ceil(n / block_size)), which "
        "loses the last block once the count is too large for a float to hold exactly",
        module=MODULE,
        old="return -(-a // b)",
        new="return int(__import__('math').ceil(a / b))",
    ),
    # -- step 2 ----------------------------------------------------------------------
    Mutant(
        name="allocate covers the whole prompt",
        mistake="allocate takes blocks for every token of the sequence, not just the ones "
        "about to be computed (a first chunk of 5 tokens of 10 takes 3 blocks)",
        module=MODULE,
        old="num_fresh = self.blocks_needed(num_cached_tokens + num_new_tokens) - len(shared)",
        new="num_fresh = self.blocks_needed(seq.num_tokens) - len(shared)",
    ),
    Mutant(
        name="a request that needs every free block is refused",
        mistake="the fit check compares with < instead of <=, so a request that needs exactly "
        "the free blocks never gets them",
        module=MODULE,
        old="return num_fresh + revived <= len(self._free)",
        new="return num_fresh + revived < len(self._free)",
    ),
    Mutant(
        name="allocate is not all or nothing",
        mistake="allocate takes the blocks the pool has and raises only afterwards, leaving "
        "the sequence with a partial table and the pool short",
        module=MODULE,
        **_in_two_places(
            ("if not self._fits(shared, num_fresh):", "if num_fresh < 0:  # checked below"),
            (
                "seq.block_table.extend(self._take_free_block() for _ in range(num_fresh))",
                "seq.block_table.extend(\n"
                "            self._take_free_block()\n"
                "            for _ in range(min(num_fresh, len(self._free)))\n"
                "        )\n"
                "        if len(seq.block_table) < len(shared) + num_fresh:\n"
                '            raise OutOfBlocksError("the pool ran out of blocks")',
            ),
        ),
    ),
    # -- step 3 ----------------------------------------------------------------------
    Mutant(
        name="decode takes a block one token early",
        mistake="append_slots makes room for one token more than the step computes, so a "
        "decode takes a new block at the last slot of the current one",
        module=MODULE,
        old="return max(0, self.blocks_needed(end) - len(seq.block_table))",
        new="return max(0, self.blocks_needed(end + 1) - len(seq.block_table))",
    ),
    Mutant(
        name="the last free block is refused to a step",
        mistake="can_append compares the missing blocks with the free ones using <, so a step "
        "that needs exactly the last free block is refused",
        module=MODULE,
        old="return self._num_missing_blocks(seq, num_new_tokens) <= len(self._free)",
        new="return self._num_missing_blocks(seq, num_new_tokens) < len(self._free)",
    ),
    Mutant(
        name="the pool hands out the block freed last",
        mistake="the free pool is used as a stack (popitem() from the back), so the block "
        "freed last, a finished sequence's shared prefix, is the first one evicted",
        module=MODULE,
        old="block_id, _ = self._free.popitem(last=False)",
        new="block_id, _ = self._free.popitem()",
    ),
    # -- step 4 ----------------------------------------------------------------------
    Mutant(
        name="free ignores the other holders",
        mistake="free sets each block's ref count to 0 and returns it to the pool, even while "
        "another sequence still shares it",
        module=MODULE,
        old="self._ref_counts[block_id] -= 1",
        new="self._ref_counts[block_id] = 0",
    ),
    Mutant(
        name="free head first",
        mistake="free releases the table from its first block to its last, so the pool hands "
        "out a finished sequence's prefix before its tail and evicts the shared part first",
        module=MODULE,
        old="for block_id in reversed(seq.block_table):",
        new="for block_id in seq.block_table:",
    ),
    # -- step 5 ----------------------------------------------------------------------
    Mutant(
        name="keys not chained",
        mistake="each full block is keyed by its own tokens only, where it is registered and "
        "where it is looked up: a block that repeats after a different prefix counts as "
        "cached, and its K/V (computed after the other prefix) is wrong",
        module=MODULE,
        **_in_two_places(
            (
                "                parent, seq.tokens(i * self.block_size, (i + 1) * self.block_size)"
                "\n            )\n            block_id = self._cached.get(key)",
                "                None, seq.tokens(i * self.block_size, (i + 1) * self.block_size)"
                "\n            )\n            block_id = self._cached.get(key)",
            ),
            (
                "                parent, seq.tokens(i * self.block_size, (i + 1) * self.block_size)"
                "\n            )\n            self._block_hash[block_id] = key",
                "                None, seq.tokens(i * self.block_size, (i + 1) * self.block_size)"
                "\n            )\n            self._block_hash[block_id] = key",
            ),
        ),
    ),
    Mutant(
        name="free keeps the hashed-block count",
        mistake="free does not forget how many of the sequence's blocks were registered (and "
        "allocate does not reset it), so a preempted sequence re-admitted into fresh blocks "
        "never registers them again: its recomputed prefix is never found",
        module=MODULE,
        **_in_two_places(
            (
                "        if self.enable_prefix_caching:\n"
                "            self._num_hashed[seq.seq_id] = len(shared)\n",
                "",
            ),
            (
                "        self._num_hashed.pop(seq.seq_id, None)\n\n    # ANCHOR_END: free",
                "    # ANCHOR_END: free",
            ),
        ),
    ),
    Mutant(
        name="a reused block stays findable",
        mistake="handing a block out again does not drop its key, so a later sequence is told "
        "its prefix is cached in a block whose slots now hold someone else's K/V",
        module=MODULE,
        old="        # Its old contents are about to be overwritten: forget them.\n"
        "        key = self._block_hash.pop(block_id, None)\n"
        "        if key is not None and self._cached.get(key) == block_id:\n"
        "            del self._cached[key]\n",
        new="",
    ),
    Mutant(
        name="reviving a cached block is free of charge",
        mistake="the fit check counts only the fresh blocks, forgetting that a cached block "
        "nobody holds sits in the free pool, so reviving it uses up a free block too",
        module=MODULE,
        old="return num_fresh + revived <= len(self._free)",
        new="return num_fresh <= len(self._free)",
    ),
    Mutant(
        name="the whole prompt can be cached",
        mistake="num_cached_tokens may return every token of the prompt, leaving no token to "
        "compute and so no logits to sample the next token from",
        module=MODULE,
        old="max_blocks = (seq.num_tokens - 1) // self.block_size",
        new="max_blocks = seq.num_tokens // self.block_size",
    ),
    Mutant(
        name="half-computed blocks registered",
        mistake="cache_full_blocks registers every block of the table, including the last one "
        "whose slots are not all computed yet",
        module=MODULE,
        old="full = min(computed // self.block_size, len(seq.block_table))",
        new="full = len(seq.block_table)",
    ),
]

MUTANTS += [
    Mutant(
        name="a later twin takes over the key",
        mistake="registering a block overwrites the key's entry, so when two sequences "
        "computed the same prefix side by side the later copy serves hits, and once it is "
        "evicted the prefix is lost although the first copy still holds it",
        module=MODULE,
        old="self._cached.setdefault(key, block_id)",
        new="self._cached[key] = block_id",
    ),
    Mutant(
        name="the block before the last token is never shared",
        mistake="num_cached_tokens always leaves the whole last block to compute "
        "(num_tokens // block_size - 1 blocks), so a prompt one token past a block "
        "boundary misses its last full block",
        module=MODULE,
        old="max_blocks = (seq.num_tokens - 1) // self.block_size",
        new="max_blocks = max(0, seq.num_tokens // self.block_size - 1)",
    ),
    Mutant(
        name="a revived block stays in the free pool",
        mistake="sharing a cached block nobody held raises its count but leaves it in the "
        "free pool, so the pool hands it out again while a sequence reads it",
        module=MODULE,
        old="                del self._free[block_id]  "
        "# revive a cached block nobody was holding\n",
        new="                pass\n",
    ),
    Mutant(
        name="a shared block is counted once",
        mistake="sharing a cached block sets its count to 1 instead of adding one, so the "
        "first holder to finish frees it under the other",
        module=MODULE,
        old="            self._ref_counts[block_id] += 1\n        seq.block_table.extend(shared)",
        new="            self._ref_counts[block_id] = 1\n        seq.block_table.extend(shared)",
    ),
]

_B = f"{MODULE}:BlockManager"
STEPS = {
    1: [f"{MODULE}:slot_of", f"{MODULE}:slot_mapping", f"{_B}.blocks_needed"],
    2: [
        f"{_B}._take_free_block",
        f"{_B}._plan_allocation",
        f"{_B}._fits",
        f"{_B}.can_allocate",
        f"{_B}.allocate",
    ],
    3: [f"{_B}._num_missing_blocks", f"{_B}.can_append", f"{_B}.append_slots"],
    4: [f"{_B}.free"],
    5: [f"{_B}.cache_full_blocks", f"{_B}.num_cached_tokens"],
}

MUTANTS += [
    Mutant(
        name="fresh blocks taken before the shared ones are revived",
        mistake="allocate takes its fresh blocks from the front of the pool before it takes the "
        "shared cached blocks out of it, so a cached block waiting at the front is handed out "
        "as a fresh block (its key dropped) and shared as well: the table holds it twice, and "
        "the new tokens' K/V overwrites the prefix the same table reads",
        module=MODULE,
        old="        for block_id in shared:\n"
        "            if self._ref_counts[block_id] == 0:\n"
        "                del self._free[block_id]  # revive a cached block nobody was holding\n"
        "            self._ref_counts[block_id] += 1\n"
        "        seq.block_table.extend(shared)\n"
        "        seq.block_table.extend(self._take_free_block() for _ in range(num_fresh))\n",
        new="        fresh = [self._take_free_block() for _ in range(num_fresh)]\n"
        "        for block_id in shared:\n"
        "            if self._ref_counts[block_id] == 0:\n"
        "                del self._free[block_id]  # revive a cached block nobody was holding\n"
        "            self._ref_counts[block_id] += 1\n"
        "        seq.block_table.extend(shared)\n"
        "        seq.block_table.extend(fresh)\n",
    ),
    Mutant(
        name="allocating no tokens is refused",
        mistake="allocate rejects num_new_tokens == 0 as misuse, though a request none of whose "
        "tokens is scheduled yet is admitted with no block",
        module=MODULE,
        old="if num_new_tokens < 0 or num_cached_tokens < 0",
        new="if num_new_tokens <= 0 or num_cached_tokens < 0",
    ),
    Mutant(
        name="can_allocate answers misuse with no",
        mistake="can_allocate returns False for a call allocate would reject as misuse, so a "
        "caller's bug looks like a full pool and the request waits forever",
        module=MODULE,
        old="return self._fits(*self._plan_allocation(seq, num_new_tokens, num_cached_tokens))",
        new="try:\n"
        "            return self._fits(\n"
        "                *self._plan_allocation(seq, num_new_tokens, num_cached_tokens)\n"
        "            )\n"
        "        except ValueError:\n"
        "            return False",
    ),
    Mutant(
        name="can_append answers misuse with no",
        mistake="can_append returns False for a step past the sequence's last token, so the "
        "caller's bug looks like a full pool (and would make the scheduler preempt)",
        module=MODULE,
        old="return self._num_missing_blocks(seq, num_new_tokens) <= len(self._free)",
        new="try:\n"
        "            return self._num_missing_blocks(seq, num_new_tokens) <= len(self._free)\n"
        "        except ValueError:\n"
        "            return False",
    ),
    Mutant(
        name="the chain restarts where registration resumes",
        mistake="cache_full_blocks starts each call's chain from no parent instead of the key "
        "of the last block already registered, so a block filled by a later step is keyed as "
        "if it began the sequence and is never found after its real prefix",
        module=MODULE,
        old="parent = self._block_hash[seq.block_table[done - 1]] if done else None",
        new="parent = None",
    ),
    Mutant(
        name="slot mapping includes its end",
        mistake="slot_mapping returns the slots of start .. end inclusive, one slot too many "
        "(and an IndexError when end is the table's last position plus one)",
        module=MODULE,
        old="return [slot_of(block_table, p, block_size) for p in range(start, end)]",
        new="return [slot_of(block_table, p, block_size) for p in range(start, end + 1)]",
    ),
]
