"""Phase 02, lab 01 — the block manager: slot math, lazy allocation, freeing, ref counts,
prefix sharing."""

import random
from collections import Counter

import pytest

from labkit import implementation
from mini_vllm.engine.sequence import Sequence

impl = implementation(
    __file__, starter="block_manager.py", reference="mini_vllm.engine.block_manager"
)


def computed(bm, seq, num_new, num_cached=0):
    """Allocate a new sequence and pretend the step computed those tokens."""
    bm.allocate(seq, num_new, num_cached)
    seq.num_computed_tokens = num_cached + num_new
    bm.cache_full_blocks(seq)
    return seq


def decode_one(bm, seq, token=1):
    """One decode step: the last sampled token gets a slot, then its K/V is computed."""
    seq.append_token(token)
    bm.append_slots(seq, 1)
    seq.num_computed_tokens += 1
    bm.cache_full_blocks(seq)


# -- step 1: slots ----------------------------------------------------------------


def test_slot_is_block_id_times_block_size_plus_offset():
    table = [7, 2, 5]
    assert [impl.slot_of(table, p, 4) for p in (0, 3, 4, 9)] == [28, 31, 8, 21]


def test_slot_mapping_covers_a_range_of_positions_across_blocks():
    assert impl.slot_mapping([7, 2], 2, 7, 4) == [30, 31, 8, 9, 10]
    assert impl.slot_mapping([7, 2], 3, 3, 4) == []


@pytest.mark.parametrize("position", [-1, 8])
def test_slot_outside_the_table_is_an_index_error(position):
    with pytest.raises(IndexError):
        impl.slot_of([7, 2], position, 4)


def test_blocks_needed_rounds_up():
    bm = impl.BlockManager(8, 4)
    assert [bm.blocks_needed(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


# -- steps 2-4: allocate, append, free ---------------------------------------------


def test_allocate_takes_blocks_only_for_the_tokens_being_computed():
    bm = impl.BlockManager(10, 4)
    whole = Sequence("whole", range(10))
    bm.allocate(whole, 10)
    assert len(whole.block_table) == 3 and len(set(whole.block_table)) == 3
    chunk = Sequence("chunk", range(10))
    bm.allocate(chunk, 5)  # a first prefill chunk of 5 tokens
    assert len(chunk.block_table) == 2
    assert not set(whole.block_table) & set(chunk.block_table)
    assert (bm.num_free_blocks, bm.num_used_blocks) == (5, 5)
    assert all(bm.ref_count(b) == 1 for b in whole.block_table + chunk.block_table)


def test_decode_takes_a_new_block_only_when_crossing_a_block_boundary():
    bm = impl.BlockManager(10, 4)
    seq = computed(bm, Sequence("a", range(7)), 7)
    decode_one(bm, seq)  # position 7: last slot of block 1
    assert len(seq.block_table) == 2
    seq.append_token(1)  # position 8: first slot of a new block
    assert bm.can_append(seq)
    bm.append_slots(seq)
    assert len(seq.block_table) == 3 and bm.num_used_blocks == 3


def test_prefill_chunk_can_take_several_blocks():
    bm = impl.BlockManager(10, 4)
    seq = computed(bm, Sequence("a", range(20)), 3)
    bm.append_slots(seq, 13)  # positions 3..15
    assert len(seq.block_table) == 4


def test_failed_allocation_changes_nothing():
    bm = impl.BlockManager(3, 4)
    holder = computed(bm, Sequence("h", range(8)), 8)
    newcomer = Sequence("n", range(8))
    assert not bm.can_allocate(newcomer, 8)
    with pytest.raises(impl.OutOfBlocksError):
        bm.allocate(newcomer, 8)
    assert newcomer.block_table == [] and bm.num_free_blocks == 1
    for _ in range(4):
        decode_one(bm, holder)  # fills the third block
    holder.append_token(1)
    table = list(holder.block_table)
    assert not bm.can_append(holder)
    with pytest.raises(impl.OutOfBlocksError):
        bm.append_slots(holder)
    assert holder.block_table == table and bm.num_free_blocks == 0


def test_free_returns_every_block_and_twice_is_harmless():
    bm = impl.BlockManager(6, 4)
    seq = computed(bm, Sequence("a", range(9)), 9)
    bm.free(seq)
    assert seq.block_table == [] and bm.num_free_blocks == 6 and bm.num_used_blocks == 0
    bm.free(seq)
    assert bm.num_free_blocks == 6


def test_misuse_is_a_value_error():
    bm = impl.BlockManager(6, 4)
    seq = computed(bm, Sequence("a", range(5)), 5)
    with pytest.raises(ValueError):
        bm.allocate(seq, 1)  # already has blocks: grow it with append_slots
    with pytest.raises(ValueError):
        bm.append_slots(seq, 1)  # all 5 tokens computed, there is no 6th


@pytest.mark.parametrize("caching", [False, True], ids=["plain", "prefix_caching"])
def test_free_plus_used_is_total_and_ref_counts_match_the_tables(caching):
    rng = random.Random(6)
    bm = impl.BlockManager(12, 2, enable_prefix_caching=caching)
    live = []
    for step in range(600):
        action = rng.random()
        if action < 0.35:
            seq = Sequence(step, [rng.randint(0, 1) for _ in range(rng.randint(1, 9))])
            cached = bm.num_cached_tokens(seq)
            num_new = rng.randint(1, seq.num_tokens - cached)
            if bm.can_allocate(seq, num_new, cached):
                live.append(computed(bm, seq, num_new, cached))
        elif action < 0.8 and live:
            seq = rng.choice(live)
            if seq.num_new_tokens == 0:
                seq.append_token(rng.randint(0, 1))
            if bm.can_append(seq, 1):
                bm.append_slots(seq, 1)
                seq.num_computed_tokens += 1
                bm.cache_full_blocks(seq)
        elif live:
            bm.free(live.pop(rng.randrange(len(live))))
        holders = Counter(b for s in live for b in s.block_table)
        assert bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks
        assert bm.num_used_blocks == len(holders)
        assert all(bm.ref_count(b) == holders[b] for b in range(bm.num_blocks))
        if not caching:
            assert all(n == 1 for n in holders.values()), "a block was handed out twice"
        for s in live:
            assert len(s.block_table) == bm.blocks_needed(s.num_computed_tokens)


# -- steps 5-6: prefix caching ------------------------------------------------------


def test_shared_prefix_reuses_full_computed_blocks_with_ref_counts():
    bm = impl.BlockManager(10, 4, enable_prefix_caching=True)
    a = computed(bm, Sequence("a", list(range(10))), 10)
    b = Sequence("b", list(range(8)) + [50, 51, 52])
    assert bm.num_cached_tokens(b) == 8
    computed(bm, b, 3, num_cached=8)
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert [bm.ref_count(x) for x in a.block_table] == [2, 2, 1]
    assert bm.num_used_blocks == 4


def test_prefix_hit_leaves_at_least_one_token_to_compute():
    bm = impl.BlockManager(10, 4, enable_prefix_caching=True)
    computed(bm, Sequence("a", range(12)), 12)
    assert bm.num_cached_tokens(Sequence("b", range(8))) == 4
    assert bm.num_cached_tokens(Sequence("c", range(9))) == 8


def test_only_full_computed_blocks_are_shared_and_only_after_the_same_prefix():
    bm = impl.BlockManager(10, 4, enable_prefix_caching=True)
    computed(bm, Sequence("a", [1, 1, 1, 1, 5, 6, 7, 8, 9, 9]), 6)  # block 1 half computed
    assert bm.num_cached_tokens(Sequence("b", [1, 1, 1, 1, 5, 6, 7, 8, 0])) == 4
    computed(bm, Sequence("c", [1, 1, 1, 1, 5, 6, 7, 8, 0]), 5, num_cached=4)
    assert bm.num_cached_tokens(Sequence("d", [1, 1, 1, 1, 5, 6, 7, 8, 3])) == 8
    assert (
        bm.num_cached_tokens(Sequence("e", [2, 2, 2, 2, 5, 6, 7, 8, 0])) == 0
    )  # same block, other prefix


def test_shared_block_is_freed_only_by_its_last_holder():
    bm = impl.BlockManager(6, 4, enable_prefix_caching=True)
    a = computed(bm, Sequence("a", range(9)), 9)
    b = computed(bm, Sequence("b", range(9)), 1, num_cached=8)
    shared = a.block_table[:2]
    bm.free(a)
    assert [bm.ref_count(x) for x in shared] == [1, 1]
    assert bm.num_used_blocks == 3
    bm.free(b)
    assert bm.num_used_blocks == 0 and bm.num_free_blocks == 6


def test_without_prefix_caching_nothing_is_shared():
    bm = impl.BlockManager(10, 4)
    computed(bm, Sequence("a", range(12)), 12)
    assert bm.num_cached_tokens(Sequence("b", range(12))) == 0


def test_freed_cached_block_is_reused_until_the_pool_hands_it_out_again():
    bm = impl.BlockManager(4, 4, enable_prefix_caching=True)
    bm.free(computed(bm, Sequence("a", range(9)), 9))
    assert bm.num_free_blocks == 4  # cached but unheld blocks count as free
    b = computed(bm, Sequence("b", range(9)), 1, num_cached=8)  # revives them
    assert bm.num_used_blocks == 3
    bm.free(b)
    computed(bm, Sequence("c", [100 + i for i in range(16)]), 16)  # evicts everything
    assert bm.num_cached_tokens(Sequence("d", range(9))) == 0
