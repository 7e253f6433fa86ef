"""The block manager (Phase 02): slot math, allocation, growth, freeing, prefix sharing.

The property tests drive random allocate / append / free sequences (with and
without prefix caching) and check the invariants of mini_vllm/engine/block_manager.py
after every operation.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from mini_vllm.engine.block_manager import (
    PAD_SLOT_ID,
    BlockManager,
    OutOfBlocksError,
    hash_block_tokens,
    slot_mapping,
    slot_of,
)
from mini_vllm.engine.sequence import Sequence


def computed(bm: BlockManager, seq: Sequence, num_new: int, num_cached: int = 0) -> Sequence:
    """Allocate for a new sequence and pretend the step computed those tokens."""
    bm.allocate(seq, num_new, num_cached)
    seq.num_computed_tokens = num_cached + num_new
    bm.cache_full_blocks(seq)
    return seq


# -- slot mapping -----------------------------------------------------------------


def test_slot_is_block_id_times_block_size_plus_offset():
    table = [7, 2, 5]
    assert slot_of(table, 0, 4) == 28
    assert slot_of(table, 3, 4) == 31
    assert slot_of(table, 4, 4) == 8
    assert slot_of(table, 9, 4) == 21


def test_slot_mapping_covers_a_range_of_positions_across_blocks():
    assert slot_mapping([7, 2], 2, 7, 4) == [30, 31, 8, 9, 10]
    assert slot_mapping([7, 2], 3, 3, 4) == []


@pytest.mark.parametrize("position", [-1, 8, 100])
def test_slot_outside_the_table_is_an_error_not_a_wrong_slot(position):
    with pytest.raises(IndexError, match="outside this block table"):
        slot_of([7, 2], position, 4)


def test_pad_slot_is_minus_one():
    assert PAD_SLOT_ID == -1


# -- allocate / append / free -----------------------------------------------------


def test_new_manager_has_every_block_free():
    bm = BlockManager(10, 4)
    assert (bm.num_free_blocks, bm.num_used_blocks) == (10, 0)
    assert all(bm.ref_count(b) == 0 for b in range(10))


@pytest.mark.parametrize("num_blocks, block_size", [(0, 4), (4, 0), (4, 2.0), (True, 4)])
def test_constructor_rejects_bad_sizes(num_blocks, block_size):
    with pytest.raises(ValueError):
        BlockManager(num_blocks, block_size)


def test_allocate_takes_only_the_blocks_for_the_tokens_being_computed():
    bm = BlockManager(10, 4)
    seq = Sequence("a", range(10))
    bm.allocate(seq, 10)
    assert len(seq.block_table) == 3 and len(set(seq.block_table)) == 3
    assert bm.num_free_blocks == 7
    chunk = Sequence("b", range(10))
    bm.allocate(chunk, 5)  # a first prefill chunk of 5 tokens
    assert len(chunk.block_table) == 2


def test_decode_takes_a_block_only_when_crossing_a_block_boundary():
    bm = BlockManager(10, 4)
    seq = computed(bm, Sequence("a", range(7)), 7)
    assert len(seq.block_table) == 2
    seq.append_token(1)  # position 7: last slot of block 1
    bm.append_slots(seq)
    assert len(seq.block_table) == 2
    seq.num_computed_tokens += 1
    seq.append_token(2)  # position 8: first slot of a new block
    assert bm.can_append(seq)
    bm.append_slots(seq)
    assert len(seq.block_table) == 3
    assert bm.num_used_blocks == 3


def test_prefill_chunk_grows_the_table_by_several_blocks():
    bm = BlockManager(10, 4)
    seq = computed(bm, Sequence("a", range(20)), 3)
    bm.append_slots(seq, 13)  # positions 3..15
    assert len(seq.block_table) == 4


def test_failed_allocation_changes_nothing():
    bm = BlockManager(3, 4)
    holder = computed(bm, Sequence("h", range(8)), 8)
    seq = Sequence("a", range(8))
    assert not bm.can_allocate(seq, 8)
    with pytest.raises(OutOfBlocksError, match="can_allocate"):
        bm.allocate(seq, 8)
    assert seq.block_table == [] and bm.num_free_blocks == 1
    holder.append_token(9)
    bm.append_slots(holder)  # takes the last block
    holder.num_computed_tokens += 1
    for _ in range(3):
        holder.append_token(9)
        bm.append_slots(holder)
        holder.num_computed_tokens += 1
    holder.append_token(9)
    assert not bm.can_append(holder)
    table = list(holder.block_table)
    with pytest.raises(OutOfBlocksError, match="can_append"):
        bm.append_slots(holder)
    assert holder.block_table == table and bm.num_free_blocks == 0


def test_free_returns_every_block_and_twice_is_harmless():
    bm = BlockManager(6, 4)
    seq = computed(bm, Sequence("a", range(9)), 9)
    bm.free(seq)
    assert seq.block_table == [] and bm.num_free_blocks == 6
    bm.free(seq)
    assert bm.num_free_blocks == 6


def test_allocate_refuses_a_sequence_that_already_has_blocks():
    bm = BlockManager(6, 4)
    seq = computed(bm, Sequence("a", range(9)), 4)
    with pytest.raises(ValueError, match="append_slots"):
        bm.allocate(seq, 4)


def test_cannot_make_room_for_tokens_the_sequence_does_not_have():
    bm = BlockManager(6, 4)
    seq = computed(bm, Sequence("a", range(5)), 5)
    with pytest.raises(ValueError, match="cannot compute"):
        bm.append_slots(seq, 1)
    with pytest.raises(ValueError, match="cannot cover"):
        bm.allocate(Sequence("b", range(5)), 6)


def test_ref_count_of_an_unknown_block_is_an_index_error():
    with pytest.raises(IndexError, match="out of range"):
        BlockManager(4, 4).ref_count(4)


# -- prefix caching ---------------------------------------------------------------


def test_without_prefix_caching_nothing_is_ever_cached():
    bm = BlockManager(10, 4)
    computed(bm, Sequence("a", range(12)), 12)
    assert bm.num_cached_tokens(Sequence("b", range(12))) == 0


def test_shared_prefix_reuses_full_computed_blocks_with_ref_counts():
    bm = BlockManager(10, 4, enable_prefix_caching=True)
    a = computed(bm, Sequence("a", list(range(10))), 10)  # blocks: [0..3] [4..7] [8, 9]
    b = Sequence("b", list(range(8)) + [50, 51, 52])
    assert bm.num_cached_tokens(b) == 8
    computed(bm, b, 3, num_cached=8)
    assert b.block_table[:2] == a.block_table[:2]
    assert b.block_table[2] != a.block_table[2]
    assert [bm.ref_count(x) for x in a.block_table] == [2, 2, 1]
    assert bm.num_used_blocks == 4


def test_prefix_hit_always_leaves_a_token_to_compute():
    bm = BlockManager(10, 4, enable_prefix_caching=True)
    computed(bm, Sequence("a", range(12)), 12)
    assert bm.num_cached_tokens(Sequence("b", range(8))) == 4  # not 8: its last token must run
    assert bm.num_cached_tokens(Sequence("c", range(9))) == 8


def test_partially_computed_block_is_not_shared():
    bm = BlockManager(10, 4, enable_prefix_caching=True)
    computed(bm, Sequence("a", range(12)), 6)  # block 1 half computed
    assert bm.num_cached_tokens(Sequence("b", range(12))) == 4


def test_equal_block_after_a_different_prefix_is_not_a_hit():
    bm = BlockManager(10, 4, enable_prefix_caching=True)
    computed(bm, Sequence("a", [1, 1, 1, 1, 5, 6, 7, 8, 0]), 9)
    # Same second block, different first block: the chained key differs.
    assert bm.num_cached_tokens(Sequence("b", [2, 2, 2, 2, 5, 6, 7, 8, 0])) == 0
    assert hash_block_tokens(None, [1, 1]) != hash_block_tokens(
        hash_block_tokens(None, [3]), [1, 1]
    )


def test_freed_cached_block_stays_shareable_until_the_pool_reuses_it():
    bm = BlockManager(4, 4, enable_prefix_caching=True)
    a = computed(bm, Sequence("a", range(9)), 9)
    bm.free(a)
    assert bm.num_free_blocks == 4  # cached but unreferenced blocks count as free
    b = Sequence("b", range(9))
    assert bm.num_cached_tokens(b) == 8
    computed(bm, b, 1, num_cached=8)  # revives both cached blocks from the free pool
    assert bm.num_used_blocks == 3
    bm.free(b)
    # Fill the cache with other tokens: every old block is evicted and forgotten.
    computed(bm, Sequence("c", [100 + i for i in range(16)]), 16)
    assert bm.num_cached_tokens(Sequence("d", range(9))) == 0


def test_eviction_takes_the_private_tail_before_the_shared_prefix():
    bm = BlockManager(5, 2, enable_prefix_caching=True)
    a = computed(bm, Sequence("a", [1, 2, 3, 4, 5, 6]), 6)
    bm.free(a)  # all 3 blocks cached and free; the tail block was freed first
    computed(bm, Sequence("x", [9, 9, 9, 9, 9, 9]), 6)  # 3 fresh: 2 never-used + a's tail
    assert bm.num_cached_tokens(Sequence("b", [1, 2, 3, 4, 5, 6, 7])) == 4


def test_cached_block_that_is_free_counts_against_free_blocks_when_revived():
    bm = BlockManager(3, 4, enable_prefix_caching=True)
    a = computed(bm, Sequence("a", range(9)), 9)
    bm.free(a)
    b = Sequence("b", list(range(8)) + list(range(20, 25)))  # 13 tokens: 2 cached + 2 fresh blocks
    assert bm.num_cached_tokens(b) == 8
    assert not bm.can_allocate(b, 5, num_cached_tokens=8)  # 2 revived + 2 fresh > 3
    assert bm.can_allocate(b, 4, num_cached_tokens=8)  # 2 revived + 1 fresh


def test_claiming_more_cached_tokens_than_are_cached_is_an_error():
    bm = BlockManager(8, 4, enable_prefix_caching=True)
    with pytest.raises(ValueError, match="cached"):
        bm.allocate(Sequence("a", range(9)), 1, num_cached_tokens=8)
    with pytest.raises(ValueError, match="multiple"):
        bm.allocate(Sequence("b", range(9)), 1, num_cached_tokens=3)


def test_twin_blocks_computed_side_by_side_are_both_safe():
    bm = BlockManager(8, 4, enable_prefix_caching=True)
    a = computed(bm, Sequence("a", range(5)), 5)
    b = computed(bm, Sequence("b", range(5)), 5)  # admitted before a registered anything
    assert a.block_table[0] != b.block_table[0]
    bm.free(a)
    c = Sequence("c", range(5))
    assert bm.num_cached_tokens(c) == 4
    computed(bm, c, 1, num_cached=4)
    bm.free(b)
    bm.free(c)
    assert bm.num_free_blocks == 8


def test_evicted_blocks_serve_no_hit_and_their_holder_keeps_registering():
    """evict_blocks: what the scheduler calls on the blocks of a step that never ran."""
    bm = BlockManager(8, 4, enable_prefix_caching=True)
    a = computed(bm, Sequence("a", range(13)), 8)  # blocks 0 and 1 registered
    bm.evict_blocks([a.block_table[1]])  # held by a: unfindable, a keeps its key
    probe = Sequence("probe", range(13))
    assert bm.num_cached_tokens(probe) == 4
    bm.append_slots(a, 4)
    a.num_computed_tokens = 12
    bm.cache_full_blocks(a)  # block 2 chains from block 1's key
    assert bm.num_cached_tokens(probe) == 4  # the lookup stops at the evicted block
    bm.free(a)
    c = computed(bm, Sequence("c", [7] * 9), 9)
    c_blocks = list(c.block_table)
    bm.free(c)
    free_before = bm.num_free_blocks
    bm.evict_blocks(c_blocks)  # free blocks: plain free blocks again
    bm.evict_blocks(range(8))  # twice, and blocks without a key: harmless
    assert bm.num_cached_tokens(Sequence("d", [7] * 9)) == 0
    assert bm.num_cached_tokens(probe) == 0
    assert bm.num_free_blocks == free_before == 8


# -- property tests ---------------------------------------------------------------


class BlockManagerMachine(RuleBasedStateMachine):
    """Random allocate / step / free, with a small token alphabet so prefixes repeat."""

    @initialize(
        num_blocks=st.integers(1, 12),
        block_size=st.integers(1, 4),
        caching=st.booleans(),
    )
    def setup(self, num_blocks, block_size, caching):
        self.bm = BlockManager(num_blocks, block_size, enable_prefix_caching=caching)
        self.live: dict[int, Sequence] = {}
        self.next_id = 0

    @rule(prompt=st.lists(st.integers(0, 2), min_size=1, max_size=14), data=st.data())
    def admit(self, prompt, data):
        seq = Sequence(self.next_id, prompt)
        self.next_id += 1
        cached = self.bm.num_cached_tokens(seq)
        assert cached % self.bm.block_size == 0 and cached < seq.num_tokens
        num_new = data.draw(st.integers(1, seq.num_tokens - cached), label="num_new")
        free_before = self.bm.num_free_blocks
        if self.bm.can_allocate(seq, num_new, cached):
            computed(self.bm, seq, num_new, cached)
            self.live[seq.seq_id] = seq
        else:
            with pytest.raises(OutOfBlocksError):
                self.bm.allocate(seq, num_new, cached)
            assert seq.block_table == [] and self.bm.num_free_blocks == free_before

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def step(self, data):
        seq = self.live[data.draw(st.sampled_from(sorted(self.live)), label="seq")]
        if seq.num_new_tokens == 0:
            seq.append_token(data.draw(st.integers(0, 2), label="sampled"))
        num_new = data.draw(st.integers(1, seq.num_new_tokens), label="num_new")
        table = list(seq.block_table)
        if self.bm.can_append(seq, num_new):
            self.bm.append_slots(seq, num_new)
            seq.num_computed_tokens += num_new
            self.bm.cache_full_blocks(seq)
        else:
            with pytest.raises(OutOfBlocksError):
                self.bm.append_slots(seq, num_new)
            assert seq.block_table == table

    @rule(block_ids=st.lists(st.integers(0, 11), max_size=3))
    def evict(self, block_ids):
        block_ids = [b for b in block_ids if b < self.bm.num_blocks]
        free_before = self.bm.num_free_blocks
        self.bm.evict_blocks(block_ids)
        assert self.bm.num_free_blocks == free_before
        for seq in self.live.values():  # no lookup finds an evicted block
            probe = Sequence("probe", seq.tokens(0, seq.num_tokens))
            assert not set(self.bm._cached_prefix(probe)) & set(block_ids)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data):
        seq = self.live.pop(data.draw(st.sampled_from(sorted(self.live)), label="seq"))
        self.bm.free(seq)
        assert seq.block_table == []

    @invariant()
    def free_plus_used_is_total(self):
        assert self.bm.num_free_blocks + self.bm.num_used_blocks == self.bm.num_blocks
        held = {b for s in self.live.values() for b in s.block_table}
        assert self.bm.num_used_blocks == len(held)

    @invariant()
    def ref_count_is_the_number_of_tables_holding_the_block(self):
        holders = defaultdict(list)
        for seq in self.live.values():
            for index, block in enumerate(seq.block_table):
                holders[block].append((seq, index))
        for block in range(self.bm.num_blocks):
            assert self.bm.ref_count(block) == len(holders.get(block, ()))

    @invariant()
    def a_block_in_two_tables_is_a_shared_computed_prefix(self):
        bs = self.bm.block_size
        holders = defaultdict(list)
        for seq in self.live.values():
            for index, block in enumerate(seq.block_table):
                holders[block].append((seq, index))
        for block, owners in holders.items():
            if len(owners) == 1:
                continue
            assert self.bm.enable_prefix_caching, (
                f"block {block} handed out twice without prefix caching"
            )
            (first, index), *rest = owners
            end = (index + 1) * bs
            for seq, other_index in rest:
                assert other_index == index
                assert seq.num_computed_tokens >= end and first.num_computed_tokens >= end
                assert seq.tokens(0, end) == first.tokens(0, end)

    @invariant()
    def tables_cover_exactly_the_computed_tokens(self):
        for seq in self.live.values():
            assert len(seq.block_table) == self.bm.blocks_needed(seq.num_computed_tokens)


BlockManagerMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestBlockManagerProperties = BlockManagerMachine.TestCase
