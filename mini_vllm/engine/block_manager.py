"""The paged KV cache's bookkeeping: which physical blocks hold which sequence's tokens.

vLLM counterpart: vllm/v1/core/kv_cache_manager.py (`KVCacheManager.allocate_slots`,
`get_computed_blocks`, `free`) over vllm/v1/core/block_pool.py (`BlockPool`: the free
queue, reference counts, the hash -> block map). nano-vllm puts the same ideas in one
class, nanovllm/engine/block_manager.py (`allocate`, `may_append`, `deallocate`,
`hash_blocks`).

The KV cache is one tensor per layer cut into `num_blocks` blocks of `block_size`
token slots. This class never touches a tensor: it hands out block *ids*. A
sequence's `block_table` lists its blocks in token order, so the token at position p
lives in block `block_table[p // block_size]` at offset `p % block_size`, which is
slot `block_table[p // block_size] * block_size + p % block_size` of the cache seen as
one long array of slots. The model runner writes each new token's K/V to its slot
(`slot_mapping`); `PAD_SLOT_ID` (-1) tells the KV write to skip a padded row.

Blocks are taken lazily, only for tokens about to be computed: a table always holds
exactly ceil(covered tokens / block_size) blocks, and a decoding sequence takes a new
block only when its next token crosses a block boundary.

Invariants (tests/engine/test_block_manager.py checks them under random operations):
- every block is free (ref count 0, in the free pool) or used (ref count > 0), so
  num_free_blocks + num_used_blocks == num_blocks;
- a block's ref count is the number of live block tables that hold it;
- a block sits in two tables only through prefix caching, and then it is full,
  computed (or being computed by the step that shared it out), and holds the same
  tokens for both.

Prefix caching (`enable_prefix_caching=True`): a block whose `block_size` tokens have
all been computed is registered under a hash of its tokens chained with the previous
block's hash, so equal hashes mean equal *prefixes*, not just equal blocks (vLLM:
`hash_block_tokens` in vllm/v1/core/kv_cache_utils.py). "Computed" is the caller's
word: the scheduler registers a block as soon as it schedules the step that fills it,
as vLLM does, because that step writes the block's K/V before anything can read it.
A new sequence whose leading blocks hash to registered ones shares those blocks (ref
count + 1) and skips their compute. A freed block keeps its hash and stays findable
until the free pool hands it out again; the pool gives out the least recently freed
block first, and a sequence's blocks are freed tail first, so shared prefixes are
evicted last (vLLM's free queue does the same). `evict_blocks` makes blocks
unfindable at once: those a failed step was to fill.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from collections.abc import Sequence as SequenceT
from typing import Protocol

from mini_vllm.errors import UserError

__all__ = [
    "PAD_SLOT_ID",
    "BlockManager",
    "OutOfBlocksError",
    "hash_block_tokens",
    "slot_mapping",
    "slot_of",
]

PAD_SLOT_ID = -1  # slot_mapping value of a padded row: the KV write skips it


class OutOfBlocksError(RuntimeError):
    """An allocation was asked for more blocks than are free (check can_* first)."""


class SequenceLike(Protocol):
    """What the block manager reads from and writes to a sequence."""

    seq_id: Hashable
    block_table: list[int]
    num_computed_tokens: int

    @property
    def num_tokens(self) -> int: ...

    def tokens(self, start: int, end: int) -> list[int]: ...


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ANCHOR: slot_mapping
def slot_of(block_table: SequenceT[int], position: int, block_size: int) -> int:
    """The flat KV-cache slot of token `position`: block id * block_size + offset."""
    block_index, offset = divmod(position, block_size)
    if position < 0 or block_index >= len(block_table):
        raise IndexError(
            f"position {position} is outside this block table ({len(block_table)} block(s) "
            f"of {block_size} tokens); allocate blocks for a token before writing it"
        )
    return block_table[block_index] * block_size + offset


def slot_mapping(block_table: SequenceT[int], start: int, end: int, block_size: int) -> list[int]:
    """Slots of positions start..end-1: where one step writes a sequence's new K/V."""
    return [slot_of(block_table, p, block_size) for p in range(start, end)]


# ANCHOR_END: slot_mapping


# ANCHOR: hash_block_tokens
def hash_block_tokens(parent: bytes | None, token_ids: SequenceT[int]) -> bytes:
    """A full block's prefix-cache key: sha256 of the previous block's key and its tokens.

    The first block of a sequence has no parent; its input is shorter than any later
    block's (no 32-byte parent digest), so the two can never collide by construction.
    """
    digest = hashlib.sha256(parent or b"")
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


# ANCHOR_END: hash_block_tokens


class BlockManager:
    """Hands out KV-cache blocks to sequences and takes them back."""

    def __init__(
        self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = False
    ) -> None:
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

    # -- counts -------------------------------------------------------------------

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
        """Blocks that hold num_tokens tokens: ceil(num_tokens / block_size)."""
        return _cdiv(num_tokens, self.block_size)

    # -- prefix caching -----------------------------------------------------------

    # ANCHOR: cached_prefix
    def _cached_prefix(self, seq: SequenceLike) -> list[int]:
        """Registered blocks that hold the sequence's leading tokens, in order."""
        if not self.enable_prefix_caching:
            return []
        params = getattr(seq, "sampling_params", None)
        if params is not None and params.prompt_logprobs is not None:
            return []  # its prompt's logits are wanted: every prompt token is computed
        # Leave at least one token to compute: the step that computes the last
        # token is the one that produces the logits the next token is sampled from.
        max_blocks = (seq.num_tokens - 1) // self.block_size
        blocks: list[int] = []
        parent = None
        for i in range(max_blocks):
            key = hash_block_tokens(
                parent, seq.tokens(i * self.block_size, (i + 1) * self.block_size)
            )
            block_id = self._cached.get(key)
            if block_id is None:
                break
            blocks.append(block_id)
            parent = key
        return blocks

    # ANCHOR_END: cached_prefix

    def num_cached_tokens(self, seq: SequenceLike) -> int:
        """How many leading tokens of a sequence without blocks are already in the
        cache (a multiple of block_size, always < num_tokens; 0 without prefix caching)."""
        return len(self._cached_prefix(seq)) * self.block_size

    # ANCHOR: cache_full_blocks
    def cache_full_blocks(self, seq: SequenceLike, num_tokens: int | None = None) -> None:
        """Register the blocks the sequence has completely computed, so later
        sequences with the same prefix can share them. No-op without prefix caching.

        `num_tokens`: how many leading tokens are computed and known (default
        num_computed_tokens). The scheduler passes the tokens computed once the step it
        is scheduling has run, so that a request admitted later in the same step shares
        the blocks that step writes (vLLM: `allocate_slots` -> `cache_blocks`), and only
        tokens whose ids are known: the async scheduler's placeholders cannot be hashed."""
        if not self.enable_prefix_caching:
            return
        done = self._num_hashed.get(seq.seq_id, 0)
        computed = seq.num_computed_tokens if num_tokens is None else num_tokens
        full = min(computed // self.block_size, len(seq.block_table))
        parent = self._block_hash[seq.block_table[done - 1]] if done else None
        for i in range(done, full):
            block_id = seq.block_table[i]
            key = hash_block_tokens(
                parent, seq.tokens(i * self.block_size, (i + 1) * self.block_size)
            )
            self._block_hash[block_id] = key
            # Two sequences that computed the same prefix side by side: the block
            # registered first keeps serving hits, the twin is just a private block.
            self._cached.setdefault(key, block_id)
            parent = key
        self._num_hashed[seq.seq_id] = max(done, full)

    # ANCHOR_END: cache_full_blocks

    # ANCHOR: evict_blocks
    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Make these blocks unfindable by prefix lookups at once, held or not (vLLM:
        `BlockPool.evict_blocks`, for blocks whose K/V failed to load).

        For blocks registered before their K/V was written, by a step that then never
        completed (the scheduler's `take_back_steps`): what they hold is unknown. A block
        still held keeps its key, which its holder's next blocks chain from, but serves no
        hit; a free one is a plain free block again. Blocks without a key are skipped.
        """
        for block_id in block_ids:
            key = self._block_hash.get(block_id)
            if key is None:
                continue
            if self._cached.get(key) == block_id:
                self._cached.pop(key)
            if not self._ref_counts[block_id]:
                self._block_hash.pop(block_id)

    # ANCHOR_END: evict_blocks

    # -- allocation ---------------------------------------------------------------

    # ANCHOR: take_free_block
    def _take_free_block(self) -> int:
        block_id, _ = self._free.popitem(last=False)
        # Its old contents are about to be overwritten: forget them.
        key = self._block_hash.pop(block_id, None)
        if key is not None and self._cached.get(key) == block_id:
            del self._cached[key]
        self._ref_counts[block_id] = 1
        return block_id

    # ANCHOR_END: take_free_block

    def _plan_allocation(
        self, seq: SequenceLike, num_new_tokens: int, num_cached_tokens: int
    ) -> tuple[list[int], int]:
        """(cached blocks to share, fresh blocks to take) for a first allocation."""
        if seq.block_table:
            raise ValueError(
                f"request {seq.seq_id!r} already holds {len(seq.block_table)} block(s); "
                "allocate() is for a sequence without blocks, use append_slots() to grow one"
            )
        if num_new_tokens < 0 or num_cached_tokens < 0 or num_cached_tokens % self.block_size:
            raise ValueError(
                "num_new_tokens must be >= 0 and num_cached_tokens a multiple of "
                f"{self.block_size}, got {num_new_tokens} and {num_cached_tokens}"
            )
        if num_cached_tokens + num_new_tokens > seq.num_tokens:
            raise ValueError(
                f"request {seq.seq_id!r} has {seq.num_tokens} tokens, cannot "
                f"cover {num_cached_tokens} cached + {num_new_tokens} new"
            )
        shared = self._cached_prefix(seq)[: num_cached_tokens // self.block_size]
        if len(shared) * self.block_size != num_cached_tokens:
            raise ValueError(
                f"only {len(shared) * self.block_size} leading tokens of request {seq.seq_id!r} "
                f"are cached, not {num_cached_tokens}; pass num_cached_tokens(seq) or less"
            )
        num_fresh = self.blocks_needed(num_cached_tokens + num_new_tokens) - len(shared)
        return shared, num_fresh

    def _fits(self, shared: list[int], num_fresh: int) -> bool:
        # A cached block nobody holds sits in the free pool: reviving it uses up a free block.
        revived = sum(1 for b in shared if self._ref_counts[b] == 0)
        return num_fresh + revived <= len(self._free)

    def can_allocate(
        self, seq: SequenceLike, num_new_tokens: int, num_cached_tokens: int = 0
    ) -> bool:
        """Whether allocate(seq, num_new_tokens, num_cached_tokens) would succeed."""
        return self._fits(*self._plan_allocation(seq, num_new_tokens, num_cached_tokens))

    # ANCHOR: allocate
    def allocate(self, seq: SequenceLike, num_new_tokens: int, num_cached_tokens: int = 0) -> None:
        """Give a sequence without blocks (new, or preempted) its first blocks: it
        shares the cached blocks of its first `num_cached_tokens` tokens (from
        num_cached_tokens(seq); 0 without prefix caching) and takes fresh blocks for the
        next `num_new_tokens`. All or nothing: OutOfBlocksError changes nothing.
        The caller sets seq.num_computed_tokens = num_cached_tokens."""
        shared, num_fresh = self._plan_allocation(seq, num_new_tokens, num_cached_tokens)
        if not self._fits(shared, num_fresh):
            raise OutOfBlocksError(
                f"request {seq.seq_id!r} needs {num_fresh} fresh block(s) (+{len(shared)} "
                f"shared), only {len(self._free)} free; check can_allocate() first"
            )
        for block_id in shared:
            if self._ref_counts[block_id] == 0:
                del self._free[block_id]  # revive a cached block nobody was holding
            self._ref_counts[block_id] += 1
        seq.block_table.extend(shared)
        seq.block_table.extend(self._take_free_block() for _ in range(num_fresh))
        if self.enable_prefix_caching:
            self._num_hashed[seq.seq_id] = len(shared)

    # ANCHOR_END: allocate

    def _num_missing_blocks(self, seq: SequenceLike, num_new_tokens: int) -> int:
        end = seq.num_computed_tokens + num_new_tokens
        if num_new_tokens < 0 or end > seq.num_tokens:
            raise ValueError(
                f"request {seq.seq_id!r} has {seq.num_tokens} tokens and "
                f"{seq.num_computed_tokens} computed; it cannot compute {num_new_tokens} more"
            )
        return max(0, self.blocks_needed(end) - len(seq.block_table))

    def can_append(self, seq: SequenceLike, num_new_tokens: int = 1) -> bool:
        """Whether append_slots(seq, num_new_tokens) would succeed."""
        return self._num_missing_blocks(seq, num_new_tokens) <= len(self._free)

    # ANCHOR: append_slot
    def append_slots(self, seq: SequenceLike, num_new_tokens: int = 1) -> None:
        """Grow a sequence's table so its next `num_new_tokens` tokens (from position
        num_computed_tokens on) have slots. Decoding (1 token) takes a block only when
        the token is the first of a new block; a prefill chunk may take several.
        All or nothing: OutOfBlocksError changes nothing."""
        missing = self._num_missing_blocks(seq, num_new_tokens)
        if missing > len(self._free):
            raise OutOfBlocksError(
                f"request {seq.seq_id!r} needs {missing} more block(s), only {len(self._free)} "
                "free; check can_append() first (the scheduler preempts to make room)"
            )
        seq.block_table.extend(self._take_free_block() for _ in range(missing))

    # ANCHOR_END: append_slot

    # ANCHOR: free
    def free(self, seq: SequenceLike) -> None:
        """Return a finished or preempted sequence's blocks. A shared block goes back
        to the pool only when its last holder lets go. Freeing twice is harmless."""
        # Tail first: the pool evicts in the order blocks arrive, so a prefix that
        # others may share outlives the private tail.
        for block_id in reversed(seq.block_table):
            self._ref_counts[block_id] -= 1
            if self._ref_counts[block_id] == 0:
                self._free[block_id] = None
        seq.block_table.clear()
        self._num_hashed.pop(seq.seq_id, None)

    # ANCHOR_END: free

    def reclaim_unheld_blocks(self) -> int:
        """Put back in the free pool every block still counted as held; returns how many.

        Only for when no sequence holds blocks any more (the scheduler calls it after an
        exception, once every request has freed its table): a block counted as held
        then was taken by an allocation that the exception cut short. What it holds is
        unknown, so it leaves the prefix cache too.
        """
        reclaimed = 0
        for block_id, count in enumerate(self._ref_counts):
            if count:
                self._ref_counts[block_id] = 0
                key = self._block_hash.pop(block_id, None)
                if key is not None and self._cached.get(key) == block_id:
                    del self._cached[key]
                self._free[block_id] = None
                reclaimed += 1
        self._num_hashed.clear()
        return reclaimed

    def __repr__(self) -> str:
        caching = ", prefix caching" if self.enable_prefix_caching else ""
        return (
            f"BlockManager({self.num_used_blocks}/{self.num_blocks} "
            f"blocks used, block_size={self.block_size}{caching})"
        )
