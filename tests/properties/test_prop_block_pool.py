"""The KV block pool under any sequence of allocate/append/fork/free/preempt.

Why a state machine: the pool's bugs are interleavings (a fork of a sequence
that shares prefix blocks, then a copy-on-write append, then a preemption of
the parent while the child lives on) that no hand-written example covers.
After every step every block's ref count must equal the number of live
sequences holding it, each free block must sit in exactly one free list, the
prefix cache's two maps must agree with each other and with the tokens the
blocks hold; and when every sequence is gone, every block is free.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    rule,
)

from hydrant.engine.block_manager import BlockManager
from hydrant.engine.sampling_params import SamplingParams
from hydrant.engine.sequence import Request, RequestTimes, Sequence

BS = 4
# Few distinct tokens and two tenants: prompts often share prefixes, so prefix hits happen.
tokens = st.lists(st.integers(0, 2), min_size=1, max_size=14)
salts = st.sampled_from([b"alice", b"bob"])


def _sequence(prompt: list[int], salt: bytes) -> Sequence:
    request = Request(
        request_id="r",
        prompt_token_ids=prompt,
        params=SamplingParams(),
        tenant_id=salt.decode(),
        tenant_weight=1.0,
        priority=0,
        times=RequestTimes(0.0),
    )
    request.cache_salt = salt  # what the scheduler sets on admission
    seq = Sequence(request, 0, None)
    request.seqs.append(seq)
    return seq


class BlockPoolMachine(RuleBasedStateMachine):
    """Drives a `BlockManager` the way the scheduler does, checking its books after each step."""

    running = Bundle("running")
    preempted = Bundle("preempted")

    def __init__(self) -> None:
        super().__init__()
        self.bm: BlockManager | None = None
        self.live: list[Sequence] = []
        self.copies: list[tuple[int, int]] = []

    @initialize(num_blocks=st.integers(2, 16), prefix_caching=st.booleans())
    def make_pool(self, num_blocks: int, prefix_caching: bool) -> None:
        self.bm = BlockManager(num_blocks, BS, enable_prefix_caching=prefix_caching)

    @property
    def pool(self) -> BlockManager:
        assert self.bm is not None
        return self.bm

    # ---- what the scheduler does -------------------------------------------------------

    def _prefill(self, seq: Sequence) -> bool:
        """Admit a waiting sequence: take its prefix hits, allocate the rest, compute it."""
        bm = self.pool
        free_before = bm.num_free_blocks
        cached = bm.find_cached_prefix(seq)
        remaining = seq.num_tokens - seq.num_computed_tokens - len(cached) * BS
        if not bm.allocate_slots(seq, remaining, cached):
            assert seq.block_table == [] and bm.num_free_blocks == free_before  # all or nothing
            return False
        assert len(seq.block_table) == bm.blocks_for(seq.num_tokens)
        self._computed(seq)
        return True

    def _computed(self, seq: Sequence) -> None:
        self.copies.extend(self.pool.pop_copies())
        seq.num_computed_tokens = seq.num_tokens
        self.pool.commit_full_blocks(seq)

    def _drop(self, seq: Sequence) -> None:
        self.live = [s for s in self.live if s is not seq]

    @rule(target=running, prompt=tokens, salt=salts)
    def allocate(self, prompt: list[int], salt: bytes) -> object:
        seq = _sequence(prompt, salt)
        if not self._prefill(seq):
            return multiple()
        self.live.append(seq)
        return seq

    @rule(target=running, seq=consumes(running), token=st.integers(0, 2))
    def append(self, seq: Sequence, token: int) -> object:
        """A decode step: one new token; when the pool is full, the sequence is preempted."""
        seq.output_token_ids.append(token)
        if self.pool.allocate_slots(seq, seq.num_uncomputed):
            self._computed(seq)
            return seq
        self._drop(seq)
        self.pool.free(seq)
        seq.reset_for_recompute()
        return multiple()

    @rule(target=running, parent=running)
    def fork(self, parent: Sequence) -> Sequence:
        child = parent.fork(parent.index + 1, None)
        self.pool.fork(parent, child)
        self.live.append(child)
        return child

    @rule(seq=consumes(running))
    def free(self, seq: Sequence) -> None:
        self._drop(seq)
        self.pool.free(seq)
        assert seq.block_table == []

    @rule(target=preempted, seq=consumes(running))
    def preempt(self, seq: Sequence) -> Sequence:
        self._drop(seq)
        self.pool.free(seq)
        seq.reset_for_recompute()
        return seq

    @rule(target=running, seq=consumes(preempted))
    def resume(self, seq: Sequence) -> object:
        """A preempted sequence is recomputed from its prompt and outputs (prefix hits help)."""
        if not self._prefill(seq):
            return multiple()
        self.live.append(seq)
        return seq

    @rule()
    def reset_prefix_cache(self) -> None:
        self.pool.reset_prefix_cache()

    # ---- the books ---------------------------------------------------------------------

    @invariant()
    def ref_counts_equal_holders(self) -> None:
        if self.bm is None:
            return
        bm = self.bm
        holders: Counter[int] = Counter()
        for seq in self.live:
            assert len(set(seq.block_table)) == len(seq.block_table), "a block held twice"
            assert len(seq.block_table) >= bm.blocks_for(seq.num_computed_tokens)
            holders.update(seq.block_table)
        for block_id in range(bm.num_blocks):
            assert bm.ref_count(block_id) == holders[block_id], block_id
        free = {b for b in range(bm.num_blocks) if bm.ref_count(b) == 0}
        empty, cached = set(bm._free_empty), set(bm._free_cached)
        assert len(empty) == len(bm._free_empty), "a block twice in the free list"
        assert not empty & cached and empty | cached == free
        assert bm.num_free_blocks == len(free)

    @invariant()
    def prefix_cache_is_consistent(self) -> None:
        if self.bm is None:
            return
        bm = self.bm
        for block_hash, block_id in bm._cached.items():
            assert bm._hash_of[block_id] == block_hash
        hashed = [b for b in range(bm.num_blocks) if bm._hash_of[b] is not None]
        assert len(hashed) == len(bm._cached)
        for block_id in bm._free_cached:
            assert bm._hash_of[block_id] is not None  # only hashed blocks are kept for reuse
        for seq in self.live:
            # A committed block that carries a hash holds exactly this sequence's tokens.
            hashes = seq.full_block_hashes(BS)
            for i in range(seq.num_committed_blocks):
                block_hash = bm._hash_of[seq.block_table[i]]
                if block_hash is not None:
                    assert block_hash == hashes[i]
            self._lookup_finds_own_blocks(seq)

    def _lookup_finds_own_blocks(self, seq: Sequence) -> None:
        """A new sequence with the same tokens and tenant hits blocks holding those tokens."""
        twin = _sequence([*seq.prompt_token_ids, *seq.output_token_ids], seq.request.cache_salt)
        hashes = twin.full_block_hashes(BS)
        for i, block_id in enumerate(self.pool.find_cached_prefix(twin)):
            assert self.pool._hash_of[block_id] == hashes[i]

    @invariant()
    def copies_move_out_of_shared_blocks(self) -> None:
        for src, dst in self.copies:
            assert src != dst
        self.copies.clear()

    def teardown(self) -> None:
        if self.bm is None:
            return
        for seq in list(self.live):
            self.pool.free(seq)
        self.live.clear()
        bm = self.bm
        assert all(bm.ref_count(b) == 0 for b in range(bm.num_blocks))
        assert bm.num_free_blocks == bm.num_blocks and bm.usage == 0.0


BlockPoolMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
TestBlockPool = BlockPoolMachine.TestCase
