"""Phase 02, lab 01 — the paged KV cache's block manager (your code).

The course's version of vLLM's vllm/v1/core/kv_cache_manager.py (`allocate_slots`,
`get_computed_blocks`, `free`) over vllm/v1/core/block_pool.py (the free queue, the
reference counts, the hash -> block map).
Run: pytest labs/phase-02/lab-01-block-manager (one step: add -m step1, -m step2, ...)

The KV cache is cut into `num_blocks` blocks of `block_size` token slots, numbered
0 .. num_blocks * block_size - 1 when the cache is seen as one long array. A
sequence's `block_table` lists its blocks in token order.

A sequence here is mini_vllm's `Sequence` (mini_vllm/engine/sequence.py). You use
`seq.seq_id`, `seq.block_table` (a list you extend and clear), `seq.num_computed_tokens`
(how many leading tokens already have their K/V in the cache; the caller moves it
forward after each step), `seq.num_tokens` and `seq.tokens(start, end)`.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Hashable
from collections.abc import Sequence as SequenceT
from typing import TYPE_CHECKING

from mini_vllm.errors import UserError

if TYPE_CHECKING:
    from mini_vllm.engine.sequence import Sequence

PAD_SLOT_ID = -1  # given: slot_mapping value of a padded row (the KV write skips it)


class OutOfBlocksError(RuntimeError):
    """Given: an allocation asked for more blocks than are free."""


# -- step 1: slots --------------------------------------------------------------------


def slot_of(block_table: SequenceT[int], position: int, block_size: int) -> int:
    """The slot of the cache where the K/V of token `position` lives.

    Guarantees: the table's blocks hold the sequence's positions in order, block_size
    consecutive positions each, and the slot returned lies inside the block that holds
    `position`. A position the table does not cover raises IndexError: a wrong slot
    would silently overwrite another sequence's K/V.

    Example: table [7, 2, 5], block_size 4: position 0 -> 28, position 9 -> 21.
    """
    raise NotImplementedError("TODO (step 1): slot_of")


def slot_mapping(block_table: SequenceT[int], start: int, end: int, block_size: int) -> list[int]:
    """The slots of positions start, start + 1, ..., end - 1, in that order; IndexError
    as in slot_of for a position the table does not cover.

    Example: table [7, 2], block_size 4, start 2, end 7 -> [30, 31, 8, 9, 10].
    """
    raise NotImplementedError("TODO (step 1): slot_mapping")


def hash_block_tokens(parent: bytes | None, token_ids: SequenceT[int]) -> bytes:
    """Given: a full block's prefix-cache key from the key of the block before it (None
    for a sequence's first block) and the block's own tokens."""
    digest = hashlib.sha256(parent or b"")
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


class BlockManager:
    """Hands out KV-cache blocks to sequences and takes them back.

    What must hold after every call (the tests check it under random operations):
    - num_free_blocks + num_used_blocks == num_blocks, and a block is free exactly when
      its ref count is 0;
    - a block's ref count is the number of live block tables that hold it;
    - a table never holds the same block twice;
    - a block is in two tables only through prefix caching, and then it is full, already
      computed, and stands for the same leading tokens in both;
    - a table holds the fewest blocks that cover the tokens it was asked to cover (a
      block is taken only when a token reaches it).
    """

    def __init__(
        self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = False
    ) -> None:
        """Given: the whole state you work with."""
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UserError(f"{name} must be an integer >= 1, got {value!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self._ref_counts = [0] * num_blocks
        # The free pool in eviction order: allocation takes from the front, a freed block
        # joins the back. An OrderedDict, so a cached block can leave from the middle
        # in O(1) when a prefix hit revives it.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        # Prefix caching state.
        self._block_hash: dict[int, bytes] = {}  # block id -> key of the prefix it completes
        self._cached: dict[bytes, int] = {}  # key -> the block that serves hits for it
        self._num_hashed: dict[Hashable, int] = {}  # seq id -> leading blocks already keyed

    @property
    def num_free_blocks(self) -> int:
        """Blocks nobody holds (a cached block nobody holds counts: it can be evicted)."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by at least one sequence."""
        return self.num_blocks - len(self._free)

    def ref_count(self, block_id: int) -> int:
        """How many live block tables hold this block."""
        if not 0 <= block_id < self.num_blocks:
            raise IndexError(f"block id {block_id} is out of range 0..{self.num_blocks - 1}")
        return self._ref_counts[block_id]

    def blocks_needed(self, num_tokens: int) -> int:
        """The fewest blocks that hold num_tokens tokens (num_tokens >= 0), exact for any
        count, however large.

        Example, block_size 4: 5 -> 2.
        """
        raise NotImplementedError("TODO (step 1): blocks_needed")

    # -- step 2: allocate -------------------------------------------------------------

    def _take_free_block(self) -> int:
        """(A helper for you; the tests never call it.) Hand out the block that has been
        free the longest, now held once. With prefix caching, whatever it held stops
        being findable: its slots are about to be overwritten."""
        raise NotImplementedError("TODO (step 2): _take_free_block")

    def can_allocate(self, seq: Sequence, num_new_tokens: int, num_cached_tokens: int = 0) -> bool:
        """Whether allocate(seq, num_new_tokens, num_cached_tokens) would succeed now.
        Changes nothing. Misuse is a ValueError, as in allocate."""
        raise NotImplementedError("TODO (step 2): can_allocate")

    def allocate(self, seq: Sequence, num_new_tokens: int, num_cached_tokens: int = 0) -> None:
        """Give a sequence without blocks (new, or preempted) its first blocks.

        Afterwards its table covers exactly its first num_cached_tokens + num_new_tokens
        tokens. The first num_cached_tokens (step 5: a multiple of block_size, at most
        num_cached_tokens(seq); always 0 without prefix caching) are covered by the
        cached blocks that already hold them, shared; the rest by blocks nobody held.
        num_new_tokens may be 0: a sequence none of whose tokens is scheduled yet takes
        no block. All or nothing: if the free pool is short, raise OutOfBlocksError and
        change nothing. A sequence that already holds blocks, more tokens than the
        sequence has, or a num_cached_tokens that is not cached, is a ValueError. (The
        caller then sets seq.num_computed_tokens.) With prefix caching, one choice in
        here is yours (the README's step 5).

        Example, block_size 4, 10 free blocks: a 10-token prompt whose first chunk of 5
        tokens is about to be computed takes 2 blocks.
        """
        raise NotImplementedError("TODO (step 2): allocate")

    # -- step 3: append ---------------------------------------------------------------

    def can_append(self, seq: Sequence, num_new_tokens: int = 1) -> bool:
        """Whether append_slots(seq, num_new_tokens) would succeed now. Changes nothing.
        Misuse is a ValueError, as in append_slots."""
        raise NotImplementedError("TODO (step 3): can_append")

    def append_slots(self, seq: Sequence, num_new_tokens: int = 1) -> None:
        """Make sure positions num_computed_tokens .. num_computed_tokens +
        num_new_tokens - 1 have slots, taking as few blocks as that needs.

        Computing past seq.num_tokens (or a negative count) is a ValueError; a short
        pool is OutOfBlocksError with nothing changed.

        Example, block_size 4: a sequence with 3 computed tokens (1 block) that computes
        13 more in one chunk ends with 4 blocks.
        """
        raise NotImplementedError("TODO (step 3): append_slots")

    # -- step 4: free -----------------------------------------------------------------

    def free(self, seq: Sequence) -> None:
        """Take back a finished or preempted sequence's blocks and clear its table.

        A block goes back to the free pool only when no table holds it any more, and of
        the blocks one call gives back, the pool hands out the sequence's last block
        first and its first block last (its prefix, the part others may share, is evicted
        last). Afterwards the sequence can be allocated again as if it were new (a
        preempted sequence is), and a new sequence may reuse its seq_id. Freeing twice
        does nothing.

        Example: a sequence holding [3, 8, 5] that shares block 3 with another: 8 and 5
        are free afterwards, 3 is still held once.
        """
        raise NotImplementedError("TODO (step 4): free")

    # -- step 5: prefix caching -------------------------------------------------------

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Make the sequence's fully computed blocks findable by later sequences.

        Called whenever seq.num_computed_tokens has moved forward (in this lab, after
        every step). Guarantees: a block becomes findable only once all of its K/V is
        computed, and only by sequences whose tokens, from the first to that block's
        last, are the same. Once findable, a block stays findable while any table holds
        it, and after it is freed until the pool hands it out again. Two sequences that
        computed the same prefix side by side each hold a copy: the copy registered first
        is the findable one, and the other never takes its place. Does nothing without
        prefix caching.

        Example, block_size 4: a sequence with 10 tokens, 6 computed: only its first
        block becomes findable.
        """
        raise NotImplementedError("TODO (step 5): cache_full_blocks")

    def num_cached_tokens(self, seq: Sequence) -> int:
        """How many leading tokens of a sequence without blocks are held by findable
        blocks: a multiple of block_size, always below seq.num_tokens (its last token
        must be computed: that step's logits give the next token); 0 without prefix
        caching. Changes nothing.

        Example, block_size 4, after [0, 1, ..., 9] was computed and registered:
        [0..7, 50, 51, 52] -> 8.
        """
        raise NotImplementedError("TODO (step 5): num_cached_tokens")
