"""Phase 02, lab 01 — the paged KV cache's block manager (your code).

Mirrors mini_vllm/engine/block_manager.py, the course's version of vLLM's
vllm/v1/core/kv_cache_manager.py (`allocate_slots`, `get_computed_blocks`, `free`)
and vllm/v1/core/block_pool.py (free queue, ref counts, hash -> block map).
Run: pytest labs/phase-02/lab-01-block-manager

The KV cache is cut into `num_blocks` blocks of `block_size` token slots. A
sequence's `block_table` lists its blocks in token order, so position p lives in slot
`block_table[p // block_size] * block_size + p % block_size`.

A sequence here is mini_vllm's `Sequence` (mini_vllm/engine/sequence.py). You use:
`seq.seq_id`, `seq.block_table` (a list you extend and clear),
`seq.num_computed_tokens` (tokens whose K/V is already in the cache),
`seq.num_tokens`, and `seq.tokens(start, end)` (token ids at those positions).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Hashable
from collections.abc import Sequence as SequenceT
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mini_vllm.engine.sequence import Sequence

PAD_SLOT_ID = -1  # given: slot_mapping value of a padded row (the KV write skips it)


class OutOfBlocksError(RuntimeError):
    """Given: an allocation asked for more blocks than are free."""


def slot_of(block_table: SequenceT[int], position: int, block_size: int) -> int:
    """The flat KV-cache slot of token `position`: block id * block_size + offset.

    A position below 0 or past the table's last block is an IndexError (never a
    wrong slot: a wrong slot silently overwrites somebody else's K/V).
    """
    raise NotImplementedError("TODO: divmod(position, block_size) gives (block index, offset)")


def slot_mapping(block_table: SequenceT[int], start: int, end: int, block_size: int) -> list[int]:
    """Slots of positions start..end-1 (empty when start == end)."""
    raise NotImplementedError("TODO: slot_of for each position")


def hash_block_tokens(parent: bytes | None, token_ids: SequenceT[int]) -> bytes:
    """Given: a full block's prefix-cache key, chained to the previous block's key
    (None for the first block). Equal keys mean equal prefixes, not just equal blocks."""
    digest = hashlib.sha256(parent or b"")
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


class BlockManager:
    """Hands out KV-cache blocks to sequences and takes them back.

    Invariants the tests check:
    - free + used == num_blocks; a block is free exactly when its ref count is 0;
    - a block's ref count == the number of live block tables holding it;
    - a block is in two tables only through prefix caching (full, computed, same prefix);
    - a table holds exactly ceil(covered tokens / block_size) blocks (lazy allocation).
    """

    def __init__(
        self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = False
    ) -> None:
        """Given: the state you work with."""
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self._ref_counts = [0] * num_blocks
        # The free pool in eviction order: take from the front (popitem(last=False)),
        # give back at the back (self._free[block_id] = None). An OrderedDict so that a
        # cached block can also leave from the middle (del self._free[block_id]).
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        # Prefix caching (steps 5-6 of the README).
        self._block_hash: dict[int, bytes] = {}  # block id -> key of the prefix it completes
        self._cached: dict[bytes, int] = {}  # key -> the block that serves hits for it
        self._num_hashed: dict[Hashable, int] = {}  # seq id -> leading blocks already keyed

    @property
    def num_free_blocks(self) -> int:
        """Given: blocks nobody holds (cached ones nobody holds included)."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        """Given: blocks held by at least one sequence."""
        return self.num_blocks - len(self._free)

    def ref_count(self, block_id: int) -> int:
        """Given: how many live block tables hold this block."""
        if not 0 <= block_id < self.num_blocks:
            raise IndexError(f"block id {block_id} is out of range 0..{self.num_blocks - 1}")
        return self._ref_counts[block_id]

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold num_tokens tokens: ceil(num_tokens / block_size)."""
        raise NotImplementedError("TODO: integer ceiling division")

    # -- allocation (steps 2-4) ---------------------------------------------------

    def _take_free_block(self) -> int:
        """Take the block at the front of the free pool, set its ref count to 1.
        With prefix caching, forget what it held: drop its hash from _block_hash and,
        if _cached maps that hash to this block, from _cached too."""
        raise NotImplementedError("TODO: popitem(last=False) on the free pool")

    def can_allocate(self, seq: Sequence, num_new_tokens: int, num_cached_tokens: int = 0) -> bool:
        """Whether allocate(seq, num_new_tokens, num_cached_tokens) would succeed."""
        raise NotImplementedError("TODO: count the blocks allocate() would need from the free pool")

    def allocate(self, seq: Sequence, num_new_tokens: int, num_cached_tokens: int = 0) -> None:
        """Give a sequence without blocks its first blocks.

        It shares the cached blocks of its first `num_cached_tokens` tokens (a
        multiple of block_size, at most num_cached_tokens(seq); always 0 without prefix
        caching) and takes fresh blocks for the next `num_new_tokens`, so that its table
        covers num_cached_tokens + num_new_tokens tokens. All or nothing: when the free
        pool is short, raise OutOfBlocksError and change nothing.
        A sequence that already has blocks, or a num_cached_tokens that is not cached,
        is a ValueError. (The caller sets seq.num_computed_tokens afterwards.)
        """
        raise NotImplementedError(
            "TODO: shared blocks get ref count + 1, then fresh blocks from the pool"
        )

    def can_append(self, seq: Sequence, num_new_tokens: int = 1) -> bool:
        """Whether append_slots(seq, num_new_tokens) would succeed."""
        raise NotImplementedError("TODO")

    def append_slots(self, seq: Sequence, num_new_tokens: int = 1) -> None:
        """Grow the table so that positions num_computed_tokens ..
        num_computed_tokens + num_new_tokens - 1 have slots: a decode step takes a
        block only when its token is the first of a new block; a prefill chunk may
        take several. Computing past seq.num_tokens is a ValueError; a short pool is
        OutOfBlocksError with nothing changed."""
        raise NotImplementedError(
            "TODO: blocks_needed(num_computed + new) - len(table) more blocks"
        )

    def free(self, seq: Sequence) -> None:
        """Return a finished or preempted sequence's blocks: ref count - 1 each, and a
        block that reaches 0 goes to the back of the free pool. Free the table tail
        first, so that a shared prefix is evicted after the private tail. Clear the
        table (and forget seq's _num_hashed entry). Freeing twice does nothing."""
        raise NotImplementedError("TODO: walk the table in reverse")

    # -- prefix caching (steps 5-6) -----------------------------------------------

    def num_cached_tokens(self, seq: Sequence) -> int:
        """How many leading tokens of a sequence without blocks sit in cached blocks:
        hash its full blocks in order (hash_block_tokens, chained) and stop at the first
        key not in _cached. Always a multiple of block_size and < seq.num_tokens (at least
        one token must be computed: its logits give the next token). 0 without prefix caching."""
        raise NotImplementedError(
            "TODO: walk the full blocks, at most (num_tokens - 1) // block_size"
        )

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the blocks the sequence has completely computed (num_computed_tokens
        // block_size of them) that are not registered yet: record each block's key in
        _block_hash and, unless the key already has a block, in _cached. No-op without
        prefix caching. Called after every step that advanced num_computed_tokens."""
        raise NotImplementedError("TODO: continue the key chain from _num_hashed[seq.seq_id]")
