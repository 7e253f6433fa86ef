"""Phase 02, lab 01 — the block manager's invariants under random operations (hypothesis).

A random mix of admissions (whole prompts or first chunks), steps (prefill chunks and
decodes), finishes and preemptions with re-admission, without prefix caching (step 4)
and with it (step 5). After every operation:
- free + used == total, and a block is free exactly when its ref count is 0;
- a block's ref count is the number of live tables that hold it;
- a block sits in two tables only when prefix caching shares it: at the same place in
  both, full, computed by both, after the same leading tokens;
- every table holds exactly the blocks its computed tokens need;
- a fake KV cache, written through the slot mapping, holds for every computed position
  the K/V of exactly that sequence's prefix: a token's K/V stands for all the tokens up
  to it, so two sequences may share a slot only if their prefixes are equal;
- a step writes only into blocks its sequence alone holds.
"""

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labkit import implementation
from mini_vllm.engine.sequence import Sequence

impl = implementation(
    __file__, starter="block_manager.py", reference="mini_vllm.engine.block_manager"
)

NUM_BLOCKS, BLOCK_SIZE = 6, 2

OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(["admit", "admit", "step", "step", "step", "finish", "preempt"]),
        st.lists(st.integers(0, 1), min_size=1, max_size=9),  # a prompt: 2 token ids
        st.integers(0, 1_000),  # which sequence, how many tokens
    ),
    max_size=40,
)

RUNS = settings(
    max_examples=150,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class World:
    """The block manager plus what the engine around it would know: the live and the
    preempted sequences, and a fake KV cache {slot: the prefix whose K/V it holds}."""

    def __init__(self, caching: bool):
        self.bm = impl.BlockManager(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=caching)
        self.caching = caching
        self.live: list[Sequence] = []
        self.waiting: list[Sequence] = []
        self.kv: dict[int, tuple[int, ...]] = {}
        self.next_id = 0

    def snapshot(self):
        tables = [list(s.block_table) for s in self.live + self.waiting]
        refs = [self.bm.ref_count(b) for b in range(NUM_BLOCKS)]
        return tables, refs, self.bm.num_free_blocks

    def write(self, seq: Sequence, start: int, end: int) -> None:
        """The model computes positions start..end-1 and writes their K/V."""
        slots = impl.slot_mapping(seq.block_table, start, end, BLOCK_SIZE)
        assert len(slots) == end - start
        for position, slot in zip(range(start, end), slots):
            block = slot // BLOCK_SIZE
            assert block in seq.block_table, f"slot {slot} is outside {seq.seq_id}'s blocks"
            assert self.bm.ref_count(block) == 1, (
                f"{seq.seq_id} writes position {position} into block {block}, which "
                f"{self.bm.ref_count(block)} tables hold: it would change their K/V"
            )
            self.kv[slot] = seq.token_ids[: position + 1]

    def admit(self, seq: Sequence, amount: int) -> None:
        cached = self.bm.num_cached_tokens(seq) if self.caching else 0
        assert cached % BLOCK_SIZE == 0 and 0 <= cached < seq.num_tokens
        num_new = 1 + amount % (seq.num_tokens - cached)
        before = self.snapshot()
        if self.bm.can_allocate(seq, num_new, cached):
            self.bm.allocate(seq, num_new, cached)
            seq.num_computed_tokens = cached
            self.write(seq, cached, cached + num_new)
            seq.num_computed_tokens = cached + num_new
            if self.caching:
                self.bm.cache_full_blocks(seq)
            self.live.append(seq)
        else:
            with pytest.raises(impl.OutOfBlocksError):
                self.bm.allocate(seq, num_new, cached)
            assert self.snapshot() == before, "a failed allocate changed something"
            if seq not in self.waiting:
                self.waiting.append(seq)

    def step(self, seq: Sequence, amount: int) -> None:
        if seq.num_new_tokens == 0:
            seq.append_token(amount % 2)  # a decode: the token sampled last step
        num_new = 1 + amount % seq.num_new_tokens
        before = self.snapshot()
        if self.bm.can_append(seq, num_new):
            self.bm.append_slots(seq, num_new)
            start = seq.num_computed_tokens
            self.write(seq, start, start + num_new)
            seq.num_computed_tokens += num_new
            if self.caching:
                self.bm.cache_full_blocks(seq)
        else:
            with pytest.raises(impl.OutOfBlocksError):
                self.bm.append_slots(seq, num_new)
            assert self.snapshot() == before, "a failed append_slots changed something"

    def apply(self, kind: str, prompt: list[int], amount: int) -> None:
        if kind == "admit":
            if self.waiting and amount % 2:
                self.admit(self.waiting.pop(amount % len(self.waiting)), amount // 2)
            else:
                self.next_id += 1
                self.admit(Sequence(self.next_id, prompt), amount)
        elif self.live:
            seq = self.live[amount % len(self.live)]
            if kind == "step":
                self.step(seq, amount // 7)
            else:
                self.live.remove(seq)
                self.bm.free(seq)
                assert seq.block_table == []
                if kind == "preempt":
                    seq.num_computed_tokens = 0
                    self.waiting.append(seq)

    def check(self) -> None:
        bm = self.bm
        holders = Counter(b for s in self.live for b in s.block_table)
        assert bm.num_free_blocks + bm.num_used_blocks == NUM_BLOCKS
        assert bm.num_used_blocks == len(holders)
        refs = [bm.ref_count(b) for b in range(NUM_BLOCKS)]
        assert refs == [holders[b] for b in range(NUM_BLOCKS)], "ref counts != holders"
        for seq in self.waiting:
            assert seq.block_table == []
        for seq in self.live:
            assert len(seq.block_table) == bm.blocks_needed(seq.num_computed_tokens)
            assert len(set(seq.block_table)) == len(seq.block_table), (
                f"{seq.seq_id}'s table holds one block twice: {seq.block_table}"
            )
        for block, count in holders.items():
            if count == 1:
                continue
            assert self.caching, f"block {block} was handed out {count} times"
            places = {
                (
                    s.block_table.index(block),
                    s.token_ids[: (s.block_table.index(block) + 1) * BLOCK_SIZE],
                )
                for s in self.live
                if block in s.block_table
            }
            assert len(places) == 1, f"block {block} is shared by different prefixes: {places}"
            ((index, _),) = places
            for s in self.live:
                if block in s.block_table:
                    assert s.block_table.count(block) == 1
                    assert s.num_computed_tokens >= (index + 1) * BLOCK_SIZE
        for seq in self.live:
            computed = seq.num_computed_tokens
            slots = impl.slot_mapping(seq.block_table, 0, computed, BLOCK_SIZE)
            for position, slot in enumerate(slots):
                assert self.kv.get(slot) == seq.token_ids[: position + 1], (
                    f"{seq.seq_id}'s position {position} reads K/V of another prefix"
                )


def run(operations, caching: bool) -> None:
    world = World(caching)
    for kind, prompt, amount in operations:
        world.apply(kind, prompt, amount)
        world.check()
    for seq in list(world.live):
        world.bm.free(seq)
    assert world.bm.num_free_blocks == NUM_BLOCKS and world.bm.num_used_blocks == 0


@pytest.mark.step4
@RUNS
@given(OPERATIONS)
def test_invariants_hold_under_random_operations(operations):
    run(operations, caching=False)


@pytest.mark.step5
@RUNS
@given(OPERATIONS)
def test_invariants_hold_under_random_operations_with_prefix_caching(operations):
    run(operations, caching=True)
