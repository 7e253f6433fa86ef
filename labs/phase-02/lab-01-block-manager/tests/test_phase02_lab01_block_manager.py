"""Phase 02, lab 01 — the block manager: slot math, lazy allocation, freeing, ref counts,
prefix sharing. One `stepN` marker a test: `pytest <lab> -m step3` runs step 3's tests,
which use only what steps 1-3 ask for."""

import pytest

import mini_vllm.engine.block_manager as reference
from labkit import implementation
from labpredict import check_predictions
from mini_vllm.engine.sequence import Sequence

impl = implementation(
    __file__, starter="block_manager.py", reference="mini_vllm.engine.block_manager"
)
answers = implementation(
    __file__, starter="predictions.py", reference="tests.course.lab_checks.phase02_lab01_answers"
)


def admit(bm, seq, num_new, num_cached=0):
    """(step 2) Give a new sequence its blocks; the step then computes those tokens."""
    bm.allocate(seq, num_new, num_cached)
    seq.num_computed_tokens = num_cached + num_new
    return seq


def compute(bm, seq, num_new=1):
    """(step 3) One step that computes the sequence's next num_new tokens."""
    bm.append_slots(seq, num_new)
    seq.num_computed_tokens += num_new


def decode(bm, seq, token=1):
    """(step 3) The last sampled token gets its slot, then its K/V is computed."""
    seq.append_token(token)
    compute(bm, seq, 1)


def admit_cached(bm, seq, num_new=None):
    """(step 5) Admit with prefix caching: share the cached leading blocks, compute
    num_new more tokens (default: all the rest), register the blocks that became full."""
    cached = bm.num_cached_tokens(seq)
    admit(bm, seq, seq.num_tokens - cached if num_new is None else num_new, cached)
    bm.cache_full_blocks(seq)
    return seq


def decode_cached(bm, seq, token=1):
    """(step 5) A decode step followed by the registration the engine does after it."""
    decode(bm, seq, token)
    bm.cache_full_blocks(seq)


def preempt(bm, seq):
    """(step 4) Preemption by recompute: the blocks go back, the K/V is forgotten."""
    bm.free(seq)
    seq.num_computed_tokens = 0


def step3_scenario(manager):
    """The README's step 3 scenario on `manager` (a module with BlockManager): a pool of
    5 blocks of 4. `a` (8-token prompt) is computed whole and samples a token; `b` (7-token
    prompt) likewise; the next step computes both sampled tokens if the pool lets it; then
    `a` alone makes room, computes and samples, one token a step, while it can. Returns the
    answers to the README's questions."""
    bm = manager.BlockManager(5, 4)
    a = Sequence("a", range(8))
    bm.allocate(a, 8)
    a.num_computed_tokens = 8
    a.append_token(7)  # sampled by a's prompt step
    blocks_after_prompt = len(a.block_table)
    b = Sequence("b", range(7))
    bm.allocate(b, 7)
    b.num_computed_tokens = 7
    b.append_token(7)
    both_decode = bm.can_append(a, 1)
    if both_decode:  # a's step, then b's, each with the pool the one before left
        bm.append_slots(a, 1)
        a.num_computed_tokens += 1
        a.append_token(7)
        both_decode = bm.can_append(b, 1)
        if both_decode:
            bm.append_slots(b, 1)
            b.num_computed_tokens += 1
            b.append_token(7)
    for _ in range(100):  # a bound, in case a wrong can_append never says no
        if not bm.can_append(a, 1):
            break
        bm.append_slots(a, 1)
        a.num_computed_tokens += 1
        a.append_token(7)
    return blocks_after_prompt, both_decode, a.num_tokens - 8


def step5_scenarios(manager):
    """The README's two step 5 scenarios on `manager`; returns the answers."""

    def admit_all(bm, seq):
        cached = bm.num_cached_tokens(seq)
        bm.allocate(seq, seq.num_tokens - cached, cached)
        seq.num_computed_tokens = seq.num_tokens
        bm.cache_full_blocks(seq)
        return seq

    bm = manager.BlockManager(6, 4, enable_prefix_caching=True)
    bm.free(admit_all(bm, Sequence("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])))
    eight_cached = bm.num_cached_tokens(Sequence("e", [1, 2, 3, 4, 5, 6, 7, 8]))
    b = admit_all(bm, Sequence("b", [1, 2, 3, 4, 5, 6, 7, 8, 9]))
    b_table, free_after_b = list(b.block_table), bm.num_free_blocks
    bm = manager.BlockManager(6, 4, enable_prefix_caching=True)
    d = admit_all(bm, Sequence("d", [1, 2, 3, 4, 5, 6]))
    d.append_token(7)  # sampled by d's prompt step
    bm.append_slots(d, 1)  # one decode step computes 7 ...
    d.num_computed_tokens += 1
    bm.cache_full_blocks(d)
    d.append_token(8)  # ... and samples 8
    after_decode = bm.num_cached_tokens(Sequence("p", [1, 2, 3, 4, 5, 6, 7, 8, 9]))
    return eight_cached, b_table, free_after_b, after_decode


# -- step 1: slots ----------------------------------------------------------------


@pytest.mark.step1
def test_slot_is_block_id_times_block_size_plus_offset():
    table = [7, 2, 5]
    assert [impl.slot_of(table, p, 4) for p in (0, 3, 4, 9, 11)] == [28, 31, 8, 21, 23]
    assert [impl.slot_of([3], p, 16) for p in (0, 15)] == [48, 63]


@pytest.mark.step1
def test_slot_mapping_covers_a_range_of_positions_across_blocks():
    assert impl.slot_mapping([7, 2], 2, 7, 4) == [30, 31, 8, 9, 10]
    assert impl.slot_mapping([7, 2], 3, 3, 4) == []
    assert impl.slot_mapping([0, 1], 0, 8, 4) == list(range(8))


@pytest.mark.step1
@pytest.mark.parametrize("position", [-1, -5, 8, 12])
def test_slot_outside_the_table_is_an_index_error(position):
    with pytest.raises(IndexError):
        impl.slot_of([7, 2], position, 4)


@pytest.mark.step1
def test_slot_mapping_past_the_table_is_an_index_error():
    with pytest.raises(IndexError):
        impl.slot_mapping([7, 2], 6, 9, 4)


@pytest.mark.step1
def test_blocks_needed_rounds_up():
    bm = impl.BlockManager(8, 4)
    assert [bm.blocks_needed(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    assert impl.BlockManager(8, 16).blocks_needed(33) == 3


@pytest.mark.step1
def test_blocks_needed_is_exact_for_a_huge_count():
    """A float division rounds 2**60 + 1 tokens down to a whole number of blocks."""
    assert impl.BlockManager(8, 16).blocks_needed(2**60 + 1) == 2**56 + 1
    assert impl.BlockManager(8, 16).blocks_needed(2**60) == 2**56


@pytest.mark.step1
def test_the_last_slot_of_a_full_table_is_valid():
    assert impl.slot_of((7, 2), 7, 4) == 11  # a tuple table works as well as a list
    assert impl.slot_mapping((7, 2), 4, 8, 4) == [8, 9, 10, 11]


# -- step 2: allocate ---------------------------------------------------------------


@pytest.mark.step2
def test_allocate_takes_blocks_only_for_the_tokens_being_computed():
    bm = impl.BlockManager(10, 4)
    whole = Sequence("whole", range(10))
    assert bm.can_allocate(whole, 10)
    bm.allocate(whole, 10)
    assert len(whole.block_table) == 3 and len(set(whole.block_table)) == 3
    chunk = Sequence("chunk", range(10))
    bm.allocate(chunk, 5)  # a first prefill chunk of 5 tokens
    assert len(chunk.block_table) == 2
    assert not set(whole.block_table) & set(chunk.block_table)
    assert (bm.num_free_blocks, bm.num_used_blocks) == (5, 5)
    assert all(bm.ref_count(b) == 1 for b in whole.block_table + chunk.block_table)
    assert all(0 <= b < 10 for b in whole.block_table + chunk.block_table)


@pytest.mark.step2
def test_allocate_a_whole_pool_then_nothing_is_left():
    bm = impl.BlockManager(3, 4)
    seq = admit(bm, Sequence("a", range(12)), 12)
    assert sorted(seq.block_table) == [0, 1, 2]
    assert (bm.num_free_blocks, bm.num_used_blocks) == (0, 3)
    assert not bm.can_allocate(Sequence("b", [1]), 1)


@pytest.mark.step2
def test_failed_allocation_changes_nothing():
    bm = impl.BlockManager(3, 4)
    holder = admit(bm, Sequence("h", range(8)), 8)
    newcomer = Sequence("n", range(8))
    assert not bm.can_allocate(newcomer, 8)
    with pytest.raises(impl.OutOfBlocksError):
        bm.allocate(newcomer, 8)
    assert newcomer.block_table == [] and bm.num_free_blocks == 1
    assert [bm.ref_count(b) for b in range(3)].count(0) == 1
    assert all(bm.ref_count(b) == 1 for b in holder.block_table)
    bm.allocate(newcomer, 4)  # a first chunk that fits still does
    assert len(newcomer.block_table) == 1 and bm.num_free_blocks == 0


@pytest.mark.step2
def test_allocating_a_sequence_that_holds_blocks_is_a_value_error():
    bm = impl.BlockManager(6, 4)
    seq = admit(bm, Sequence("a", range(5)), 5)
    with pytest.raises(ValueError):
        bm.allocate(seq, 1)  # already has blocks: grow it with append_slots
    with pytest.raises(ValueError):
        bm.allocate(Sequence("b", range(5)), 6)  # more tokens than the sequence has
    with pytest.raises(ValueError):
        bm.can_allocate(seq, 1)  # the question is misuse too, not a "no"
    with pytest.raises(ValueError):
        bm.can_allocate(Sequence("b", range(5)), 6)
    assert bm.num_used_blocks == 2


@pytest.mark.step2
def test_allocating_no_tokens_takes_no_block():
    """A request admitted before any of its tokens is scheduled holds no block yet, even
    when the pool is empty."""
    bm = impl.BlockManager(2, 4)
    admit(bm, Sequence("h", range(8)), 8)
    seq = Sequence("a", range(5))
    assert bm.can_allocate(seq, 0)
    bm.allocate(seq, 0)
    assert seq.block_table == [] and bm.num_free_blocks == 0


# -- step 3: append -----------------------------------------------------------------


@pytest.mark.step3
def test_your_step3_predictions_match_what_the_reference_computes():
    blocks_after_prompt, both_decode, tokens_sampled = step3_scenario(reference)
    check_predictions(
        answers,
        {
            "S3_BLOCKS_AFTER_PROMPT": blocks_after_prompt,
            "S3_BOTH_DECODE": both_decode,
            "S3_TOKENS_SAMPLED": tokens_sampled,
        },
    )


@pytest.mark.step3
def test_the_readme_scenario_runs_the_same_on_your_code():
    assert step3_scenario(impl) == step3_scenario(reference)


@pytest.mark.step3
def test_the_last_free_block_serves_a_step():
    bm = impl.BlockManager(3, 4)
    admit(bm, Sequence("h", range(8)), 8)  # 1 block left
    seq = admit(bm, Sequence("a", range(9)), 0)
    assert bm.can_append(seq, 4)  # needs exactly the one free block
    compute(bm, seq, 4)
    assert bm.num_free_blocks == 0 and len(seq.block_table) == 1
    assert bm.can_append(seq, 0) and not bm.can_append(seq, 1)


@pytest.mark.step3
def test_decode_takes_a_new_block_only_when_crossing_a_block_boundary():
    bm = impl.BlockManager(10, 4)
    seq = admit(bm, Sequence("a", range(7)), 7)
    decode(bm, seq)  # position 7: last slot of block 1
    assert len(seq.block_table) == 2 and bm.num_used_blocks == 2
    seq.append_token(1)  # position 8: first slot of a new block
    assert bm.can_append(seq)
    bm.append_slots(seq)
    assert len(seq.block_table) == 3 and bm.num_used_blocks == 3
    assert len(set(seq.block_table)) == 3


@pytest.mark.step3
def test_prefill_chunks_take_exactly_the_blocks_they_reach():
    bm = impl.BlockManager(10, 4)
    seq = admit(bm, Sequence("a", range(20)), 3)
    compute(bm, seq, 1)  # position 3: still block 0
    assert len(seq.block_table) == 1
    compute(bm, seq, 12)  # positions 4..15
    assert len(seq.block_table) == 4
    compute(bm, seq, 0)
    assert len(seq.block_table) == 4 and bm.num_used_blocks == 4


@pytest.mark.step3
def test_failed_append_changes_nothing():
    bm = impl.BlockManager(3, 4)
    holder = admit(bm, Sequence("h", range(8)), 8)
    for _ in range(4):
        decode(bm, holder)  # fills the third block
    holder.append_token(1)
    table = list(holder.block_table)
    assert bm.num_free_blocks == 0 and not bm.can_append(holder)
    with pytest.raises(impl.OutOfBlocksError):
        bm.append_slots(holder)
    assert holder.block_table == table and bm.num_free_blocks == 0


@pytest.mark.step3
def test_computing_past_the_last_token_is_a_value_error():
    bm = impl.BlockManager(6, 4)
    seq = admit(bm, Sequence("a", range(5)), 5)
    with pytest.raises(ValueError):
        bm.append_slots(seq, 1)  # all 5 tokens computed, there is no 6th
    with pytest.raises(ValueError):
        bm.can_append(seq, 1)  # the question is misuse too, not a "no"
    seq.append_token(9)
    with pytest.raises(ValueError):
        bm.append_slots(seq, 2)
    with pytest.raises(ValueError):
        bm.can_append(seq, -1)
    assert len(seq.block_table) == 2 and bm.num_used_blocks == 2


# -- step 4: free -------------------------------------------------------------------


@pytest.mark.step4
def test_free_returns_every_block_and_twice_is_harmless():
    bm = impl.BlockManager(6, 4)
    seq = admit(bm, Sequence("a", range(9)), 9)
    other = admit(bm, Sequence("b", range(3)), 3)
    bm.free(seq)
    assert seq.block_table == [] and bm.num_free_blocks == 5 and bm.num_used_blocks == 1
    assert bm.ref_count(other.block_table[0]) == 1
    assert sum(bm.ref_count(b) for b in range(6)) == 1
    bm.free(seq)
    assert bm.num_free_blocks == 5


@pytest.mark.step4
def test_freed_blocks_are_handed_out_again():
    bm = impl.BlockManager(3, 4)
    first = admit(bm, Sequence("a", range(12)), 12)
    blocks = set(first.block_table)
    preempt(bm, first)
    second = admit(bm, Sequence("b", range(12)), 12)
    assert set(second.block_table) == blocks
    again = admit(bm, Sequence("a2", range(5)), 0)  # no tokens yet, no block
    assert again.block_table == [] and bm.num_free_blocks == 0


@pytest.mark.step4
def test_free_hands_a_tables_blocks_back_last_block_first():
    """The pool hands out the block free the longest first; of one table's blocks, the last
    must come out first and the first last."""
    bm = impl.BlockManager(6, 4)
    a = admit(bm, Sequence("a", range(16)), 16)  # 4 blocks; 2 never-used blocks stay free
    table = list(a.block_table)
    bm.free(a)
    never_used = admit(bm, Sequence("x", range(8)), 8)
    assert not set(never_used.block_table) & set(table)
    assert admit(bm, Sequence("y", range(4)), 4).block_table == [table[3]]
    assert admit(bm, Sequence("z", range(12)), 12).block_table == [table[2], table[1], table[0]]


# -- step 5: prefix caching ---------------------------------------------------------


@pytest.mark.step5
def test_your_step5_predictions_match_what_the_reference_computes():
    eight_cached, b_table, free_after_b, after_decode = step5_scenarios(reference)
    check_predictions(
        answers,
        {
            "S5_EIGHT_TOKENS_CACHED": eight_cached,
            "S5_B_TABLE": b_table,
            "S5_FREE_AFTER_B": free_after_b,
            "S5_AFTER_DECODE_CACHED": after_decode,
        },
    )


@pytest.mark.step5
def test_the_readme_scenarios_run_the_same_on_your_code():
    assert step5_scenarios(impl) == step5_scenarios(reference)


@pytest.mark.step5
def test_a_prefix_computed_twice_side_by_side_stays_findable_while_its_first_copy_lives():
    """a and b compute the same prompt in the same step, each in its own blocks; a's copy
    is registered first. When b's copy is gone, a still holds the same K/V: it must still
    be found."""
    bm = impl.BlockManager(6, 4, enable_prefix_caching=True)
    a = admit(bm, Sequence("a", range(9)), 9)
    b = admit(bm, Sequence("b", range(9)), 9)
    bm.cache_full_blocks(a)
    bm.cache_full_blocks(b)
    assert not set(a.block_table) & set(b.block_table)
    bm.free(b)
    admit(bm, Sequence("hog", [99] * 12), 12)  # takes every free block, b's included
    assert bm.num_cached_tokens(Sequence("c", range(9))) == 8


@pytest.mark.step5
def test_a_new_sequence_may_reuse_a_finished_sequences_id():
    bm = impl.BlockManager(8, 4, enable_prefix_caching=True)
    bm.free(admit_cached(bm, Sequence("req-1", range(9))))
    again = admit_cached(bm, Sequence("req-1", [50 + i for i in range(9)]))
    assert again.num_computed_tokens == 9
    probe = Sequence("probe", [50 + i for i in range(8)] + [0])
    assert bm.num_cached_tokens(probe) == 8  # the new req-1 registered its own blocks


@pytest.mark.step5
def test_a_prompt_one_token_past_a_block_boundary_shares_every_full_block():
    bm = impl.BlockManager(10, 4, enable_prefix_caching=True)
    a = admit_cached(bm, Sequence("a", range(12)))
    b = admit_cached(bm, Sequence("b", range(9)))
    assert b.block_table[:2] == a.block_table[:2] and len(b.block_table) == 3
    assert [bm.ref_count(x) for x in a.block_table] == [2, 2, 1]


@pytest.mark.step5
def test_a_new_sequence_finds_the_full_computed_blocks_of_its_prefix():
    bm = impl.BlockManager(10, 4, enable_prefix_caching=True)
    admit_cached(bm, Sequence("a", range(10)))
    assert bm.num_cached_tokens(Sequence("b", list(range(8)) + [50, 51, 52])) == 8
    assert bm.num_cached_tokens(Sequence("c", list(range(4)) + [50, 51, 52])) == 4
    assert bm.num_cached_tokens(Sequence("d", [50] + list(range(1, 10)))) == 0
    assert bm.num_used_blocks == 3  # looking up takes nothing


@pytest.mark.step5
def test_shared_prefix_reuses_the_blocks_with_ref_counts():
    bm = impl.BlockManager(10, 4, enable_prefix_caching=True)
    a = admit_cached(bm, Sequence("a", range(10)))
    b = admit_cached(bm, Sequence("b", list(range(8)) + [50, 51, 52]))
    assert b.num_computed_tokens == 11
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert [bm.ref_count(x) for x in a.block_table] == [2, 2, 1]
    assert bm.num_used_blocks == 4


@pytest.mark.step5
def test_prefix_hit_leaves_at_least_one_token_to_compute():
    bm = impl.BlockManager(10, 4, enable_prefix_caching=True)
    admit_cached(bm, Sequence("a", range(12)))
    assert bm.num_cached_tokens(Sequence("b", range(8))) == 4
    assert bm.num_cached_tokens(Sequence("c", range(9))) == 8
    assert bm.num_cached_tokens(Sequence("d", range(4))) == 0


@pytest.mark.step5
def test_only_fully_computed_blocks_are_found():
    bm = impl.BlockManager(10, 4, enable_prefix_caching=True)
    a = admit_cached(bm, Sequence("a", [1, 1, 1, 1, 5, 6, 7, 8, 9, 9]), num_new=6)
    assert bm.num_cached_tokens(Sequence("b", [1, 1, 1, 1, 5, 6, 7, 8, 0])) == 4
    compute(bm, a, 2)  # the second block is now computed
    bm.cache_full_blocks(a)
    assert bm.num_cached_tokens(Sequence("c", [1, 1, 1, 1, 5, 6, 7, 8, 0])) == 8


@pytest.mark.step5
def test_a_block_is_found_only_after_the_same_prefix():
    bm = impl.BlockManager(10, 4, enable_prefix_caching=True)
    admit_cached(bm, Sequence("a", [1, 1, 1, 1, 5, 6, 7, 8, 9]))
    assert bm.num_cached_tokens(Sequence("b", [2, 2, 2, 2, 5, 6, 7, 8, 0])) == 0


@pytest.mark.step5
def test_a_prompt_that_repeats_its_first_block_shares_only_the_first():
    """The README's question: the second [1, 2, 3, 4] comes after a different prefix."""
    bm = impl.BlockManager(10, 4, enable_prefix_caching=True)
    a = admit_cached(bm, Sequence("a", [1, 2, 3, 4, 5, 6, 7, 8, 9]))
    b = Sequence("b", [1, 2, 3, 4, 1, 2, 3, 4, 0])
    assert bm.num_cached_tokens(b) == 4
    admit_cached(bm, b)
    assert b.block_table[0] == a.block_table[0]
    assert len(set(b.block_table)) == 3 and bm.ref_count(a.block_table[0]) == 2


@pytest.mark.step5
def test_blocks_filled_by_decoding_are_registered_too():
    bm = impl.BlockManager(10, 4, enable_prefix_caching=True)
    a = admit_cached(bm, Sequence("a", [3, 1, 4, 1, 5, 9]))
    for token in (2, 6, 5, 3):  # positions 6..9: the second block fills up
        decode_cached(bm, a, token)
    assert a.num_computed_tokens == 10
    probe = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9]
    assert bm.num_cached_tokens(Sequence("b", probe)) == 8
    decode_cached(bm, a, 5)
    decode_cached(bm, a, 0)  # positions 10, 11: the third block is full, [5, 3, 5, 0]
    assert bm.num_cached_tokens(Sequence("c", probe)) == 8  # its third block differs
    assert bm.num_cached_tokens(Sequence("d", a.token_ids[:12] + (7,))) == 12


@pytest.mark.step5
def test_without_prefix_caching_nothing_is_found():
    bm = impl.BlockManager(10, 4)
    a = admit(bm, Sequence("a", range(12)), 12)
    bm.cache_full_blocks(a)
    assert bm.num_cached_tokens(Sequence("b", range(12))) == 0
    with pytest.raises(ValueError):
        bm.allocate(Sequence("c", range(12)), 4, 8)


@pytest.mark.step5
def test_claiming_more_cached_tokens_than_are_cached_is_a_value_error():
    bm = impl.BlockManager(10, 4, enable_prefix_caching=True)
    admit_cached(bm, Sequence("a", range(9)))
    b = Sequence("b", list(range(4)) + [0] * 8)
    with pytest.raises(ValueError):
        bm.allocate(b, 4, 8)
    assert b.block_table == [] and bm.num_used_blocks == 3


@pytest.mark.step5
def test_shared_block_is_freed_only_by_its_last_holder():
    bm = impl.BlockManager(6, 4, enable_prefix_caching=True)
    a = admit_cached(bm, Sequence("a", range(9)))
    b = admit_cached(bm, Sequence("b", range(9)))
    shared = a.block_table[:2]
    assert b.block_table[:2] == shared and bm.num_used_blocks == 4
    bm.free(a)
    assert [bm.ref_count(x) for x in shared] == [1, 1]
    assert bm.num_used_blocks == 3 and bm.num_free_blocks == 3
    bm.free(b)
    assert bm.num_used_blocks == 0 and bm.num_free_blocks == 6


@pytest.mark.step5
def test_a_freed_cached_block_is_found_until_the_pool_hands_it_out_again():
    bm = impl.BlockManager(4, 4, enable_prefix_caching=True)
    bm.free(admit_cached(bm, Sequence("a", range(9))))
    assert bm.num_free_blocks == 4  # cached but unheld blocks count as free
    b = admit_cached(bm, Sequence("b", range(9)))  # revives two of them
    assert b.num_computed_tokens == 9 and bm.num_used_blocks == 3
    assert [bm.ref_count(x) for x in b.block_table] == [1, 1, 1]
    bm.free(b)
    admit_cached(bm, Sequence("c", [100 + i for i in range(16)]))  # takes every block
    assert bm.num_cached_tokens(Sequence("d", range(9))) == 0


@pytest.mark.step5
def test_reviving_a_cached_block_uses_up_a_free_block():
    bm = impl.BlockManager(4, 4, enable_prefix_caching=True)
    bm.free(admit_cached(bm, Sequence("a", range(9))))  # 2 cached blocks, all 4 free
    hog = admit(bm, Sequence("hog", [7] * 4), 4)  # takes a block that held nothing cached
    b = Sequence("b", range(13))
    assert bm.num_cached_tokens(b) == 8
    # 13 tokens are 4 blocks: 2 cached ones revived + 2 fresh, and only 3 blocks are free.
    assert not bm.can_allocate(b, 5, 8)
    with pytest.raises(impl.OutOfBlocksError):
        bm.allocate(b, 5, 8)
    assert b.block_table == [] and bm.num_free_blocks == 3
    assert bm.num_cached_tokens(b) == 8
    assert bm.can_allocate(b, 4, 8)
    bm.free(hog)
    assert bm.can_allocate(b, 5, 8)


@pytest.mark.step5
def test_a_finished_requests_prefix_outlives_its_tail_in_the_pool():
    bm = impl.BlockManager(4, 4, enable_prefix_caching=True)
    a = admit_cached(bm, Sequence("a", range(13)))  # 4 blocks, the first 3 registered
    table = list(a.block_table)
    bm.free(a)
    x = admit_cached(bm, Sequence("x", [50, 51, 52, 53, 54]))  # takes 2 of the 4 free blocks
    assert x.block_table == [table[3], table[2]]
    assert bm.num_cached_tokens(Sequence("a2", range(13))) == 8
    admit_cached(bm, Sequence("y", [60]))  # one more: the second block goes
    assert bm.num_cached_tokens(Sequence("a3", range(13))) == 4


@pytest.mark.step5
def test_a_cached_prefix_at_the_front_of_the_pool_is_shared_not_overwritten():
    """b shares a's cached block 0, which waits at the front of the pool, and needs one
    fresh block for its fifth token. If block 0 were handed out as that fresh block as
    well, b's table would hold it twice and b's token 99 would overwrite, in the very
    block b reads its prefix from, the K/V of position 0."""
    bm = impl.BlockManager(2, 4, enable_prefix_caching=True)
    a = admit_cached(bm, Sequence("a", [0, 1, 2, 3]))  # one block, full and registered
    c = admit_cached(bm, Sequence("c", [50, 51, 52, 53]))  # the other block
    cached_block = a.block_table[0]
    bm.free(a)
    bm.free(c)  # both free; a's cached block has waited the longest
    b = Sequence("b", [0, 1, 2, 3, 99])
    assert bm.num_cached_tokens(b) == 4
    admit_cached(bm, b)
    assert b.block_table[0] == cached_block
    assert len(set(b.block_table)) == 2, f"b's table holds one block twice: {b.block_table}"
    assert [bm.ref_count(x) for x in b.block_table] == [1, 1]
    assert bm.num_cached_tokens(Sequence("d", [0, 1, 2, 3, 7])) == 4  # still found


@pytest.mark.step5
def test_a_preempted_sequence_registers_its_recomputed_blocks_again():
    bm = impl.BlockManager(5, 4, enable_prefix_caching=True)
    a = admit_cached(bm, Sequence("a", range(10)))
    for token in (10, 11, 12):
        decode_cached(bm, a, token)  # 13 computed: 3 full blocks registered
    preempt(bm, a)
    bm.free(admit_cached(bm, Sequence("hog", [99] * 20)))  # evicts everything a had
    assert bm.num_cached_tokens(a) == 0
    admit_cached(bm, a)  # recomputes all 13 tokens in fresh blocks
    assert bm.num_cached_tokens(Sequence("b", a.token_ids[:12] + (0,))) == 12
    decode_cached(bm, a, 13)
    decode_cached(bm, a, 14)
    decode_cached(bm, a, 15)  # 16 computed: the fourth block is full
    assert bm.num_cached_tokens(Sequence("c", a.token_ids[:16] + (0,))) == 16


@pytest.mark.step5
def test_a_readmitted_sequence_shares_its_own_cached_blocks():
    bm = impl.BlockManager(8, 4, enable_prefix_caching=True)
    a = admit_cached(bm, Sequence("a", range(10)))
    decode_cached(bm, a, 10)
    decode_cached(bm, a, 11)
    table = list(a.block_table)
    preempt(bm, a)
    assert bm.num_cached_tokens(a) == 8
    admit_cached(bm, a, num_new=1)  # resumes after its 2 cached blocks
    assert a.block_table[:2] == table[:2] and a.num_computed_tokens == 9
    compute(bm, a, 3)
    bm.cache_full_blocks(a)
    assert bm.num_cached_tokens(Sequence("b", a.token_ids[:12] + (0,))) == 12
