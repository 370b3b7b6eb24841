"""The pool of KV blocks: allocation, reference counts, prefix caching, copy-on-write.

Every block is in exactly one of three states: in use (ref count > 0), free
and empty, or free but still holding a full, hashed prefix block that a later
request with the same prefix may reuse. Free cached blocks are kept in LRU
order and are evicted (their hash forgotten) only when no empty block is
left, so memory is never idle while a reusable prefix could sit in it.

A block is shared by several sequences after a prefix-cache hit (full blocks,
never written again) or after a fork for `n > 1` (then the last, partially
filled block is shared too). Writing into a shared block copies it first:
`allocate_slots` gives the writer a private copy and queues the (src, dst)
pair, which the model runner applies before the forward.
"""

from __future__ import annotations

from collections import OrderedDict

from hydrant.engine.block_table import BlockTable
from hydrant.engine.sequence import Sequence


class BlockManager:
    """Hands out blocks of `block_size` token slots to sequences."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._ref = [0] * num_blocks
        self._hash_of: list[bytes | None] = [None] * num_blocks
        self._cached: dict[bytes, int] = {}  # hash -> block holding that prefix block
        self._free_empty: list[int] = list(range(num_blocks - 1, -1, -1))
        self._free_cached: OrderedDict[int, None] = OrderedDict()  # LRU first
        self._copies: list[tuple[int, int]] = []
        self.prefix_queries = 0  # tokens looked up in the prefix cache
        self.prefix_hits = 0  # of those, tokens found

    # ---- state -------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take now (empty ones plus evictable cached ones)."""
        return len(self._free_empty) + len(self._free_cached)

    @property
    def usage(self) -> float:
        """Share of the pool held by live sequences (0-1); evictable cache counts as free."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def ref_count(self, block_id: int) -> int:
        return self._ref[block_id]

    def pop_copies(self) -> list[tuple[int, int]]:
        """The copy-on-write copies queued since the last call, for the model runner."""
        copies, self._copies = self._copies, []
        return copies

    # ---- prefix cache -------------------------------------------------------------------

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Blocks already holding this sequence's leading full blocks (no refs taken).

        At least one token is always left to compute, since the sampler needs
        the logits of the last one; a fully cached sequence gives up its last
        block rather than overwrite a shared one.
        """
        if not self.enable_prefix_caching:
            return []
        hashes = seq.full_block_hashes(self.block_size)
        limit = (seq.num_tokens - 1) // self.block_size
        hits: list[int] = []
        for block_hash in hashes[:limit]:
            block_id = self._cached.get(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def record_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Count one admitted sequence's lookup (not repeated lookups while it waits)."""
        if self.enable_prefix_caching:
            self.prefix_queries += num_tokens
            self.prefix_hits += num_hit_tokens

    def commit_full_blocks(self, seq: Sequence) -> None:
        """Offer the sequence's newly computed full blocks to the prefix cache."""
        if not self.enable_prefix_caching:
            return
        full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        if full <= seq.num_committed_blocks:
            return
        hashes = seq.full_block_hashes(self.block_size)
        for i in range(seq.num_committed_blocks, full):
            block_id = seq.block_table[i]
            if self._hash_of[block_id] is None and hashes[i] not in self._cached:
                self._hash_of[block_id] = hashes[i]
                self._cached[hashes[i]] = block_id
        seq.num_committed_blocks = full

    # ---- allocation ---------------------------------------------------------------------

    def allocate_slots(
        self, seq: Sequence, num_new_tokens: int, cached: list[int] | None = None, reserve: int = 0
    ) -> bool:
        """Make room for the next `num_new_tokens` of `seq`; all or nothing.

        `cached` are prefix-cache hits for a sequence holding no blocks yet
        (from `find_cached_prefix`); they become the start of its block table
        and `num_computed_tokens` moves past them. `reserve` is a number of
        blocks that must stay free afterwards (a watermark for admissions).
        """
        cached = cached or []
        computed = seq.num_computed_tokens + len(cached) * self.block_size
        table_len = len(seq.block_table) + len(cached)
        new_blocks = max(0, self.blocks_for(computed + num_new_tokens) - table_len)
        write_block = computed // self.block_size
        cow = (
            num_new_tokens > 0
            and write_block < len(seq.block_table)
            and self._ref[seq.block_table[write_block]] > 1
        )
        revived = sum(1 for b in cached if self._ref[b] == 0)
        if new_blocks + int(cow) + revived + reserve > self.num_free_blocks:
            return False
        for block_id in cached:
            self._take(block_id)
        seq.block_table.extend(cached)
        seq.num_computed_tokens = computed
        if cow:
            old = seq.block_table[write_block]
            new = self._allocate_empty()
            self._ref[old] -= 1
            seq.block_table[write_block] = new
            self._copies.append((old, new))
        seq.block_table.extend(self._allocate_empty() for _ in range(new_blocks))
        return True

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """The child shares every block of the parent (its table is already a copy)."""
        for block_id in parent.block_table:
            self._ref[block_id] += 1
        child.block_table = BlockTable(parent.block_table)

    def free(self, seq: Sequence) -> None:
        """Release the sequence's blocks; cached ones stay reusable, tail blocks evicted first."""
        for block_id in reversed(seq.block_table):
            self._ref[block_id] -= 1
            if self._ref[block_id] > 0:
                continue
            if self._hash_of[block_id] is not None:
                self._free_cached[block_id] = None
            else:
                self._free_empty.append(block_id)
        seq.block_table = BlockTable()

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (e.g. after the weights changed)."""
        for block_id in list(self._free_cached):
            self._evict(block_id)
            self._free_empty.append(block_id)
        self._free_cached.clear()
        for block_id, block_hash in enumerate(self._hash_of):
            if block_hash is not None:
                self._evict(block_id)

    def _take(self, block_id: int) -> None:
        if self._ref[block_id] == 0:
            self._free_cached.pop(block_id)
        self._ref[block_id] += 1

    def _evict(self, block_id: int) -> None:
        block_hash = self._hash_of[block_id]
        if block_hash is not None:
            self._hash_of[block_id] = None
            if self._cached.get(block_hash) == block_id:
                del self._cached[block_hash]

    def _allocate_empty(self) -> int:
        if self._free_empty:
            block_id = self._free_empty.pop()
        else:
            block_id, _ = self._free_cached.popitem(last=False)
            self._evict(block_id)
        self._ref[block_id] = 1
        return block_id
