"""The KV block pool on its own: allocation, prefix cache, LRU reuse, copy-on-write."""

from __future__ import annotations

import pytest

from hydrant.engine.block_manager import BlockManager
from hydrant.engine.sampling_params import SamplingParams
from hydrant.engine.sequence import Request, RequestTimes, Sequence

BS = 4


def _seq(tokens: list[int], salt: bytes = b"t") -> Sequence:
    request = Request(
        request_id="r",
        prompt_token_ids=tokens,
        params=SamplingParams(),
        tenant_id="t",
        tenant_weight=1.0,
        priority=0,
        times=RequestTimes(0.0),
    )
    request.cache_salt = salt  # what the scheduler sets on admission
    seq = Sequence(request, 0, None)
    request.seqs.append(seq)
    return seq


def _prefill(bm: BlockManager, seq: Sequence, reserve: int = 0) -> bool:
    """Allocate with prefix hits and mark everything computed, as a finished prefill does."""
    cached = bm.find_cached_prefix(seq)
    remaining = seq.num_tokens - len(cached) * BS
    if not bm.allocate_slots(seq, remaining, cached, reserve):
        return False
    seq.num_computed_tokens = seq.num_tokens
    bm.commit_full_blocks(seq)
    return True


def test_allocate_and_free_return_every_block() -> None:
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    seq = _seq(list(range(10)))
    assert _prefill(bm, seq)
    assert len(seq.block_table) == 3
    assert bm.num_free_blocks == 5
    assert bm.usage == pytest.approx(3 / 8)
    bm.free(seq)
    assert bm.num_free_blocks == 8 and bm.usage == 0.0


def test_allocation_is_all_or_nothing() -> None:
    bm = BlockManager(2, BS, enable_prefix_caching=False)
    seq = _seq(list(range(12)))
    assert not bm.allocate_slots(seq, 12)
    assert seq.block_table == [] and bm.num_free_blocks == 2


def test_prefix_hit_shares_full_blocks_and_counts_tokens() -> None:
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    first = _seq(list(range(10)))
    assert _prefill(bm, first)
    second = _seq([*range(8), 99, 98, 97])
    hits = bm.find_cached_prefix(second)
    assert hits == first.block_table[:2]  # the two full blocks; the partial third is not cached
    assert bm.allocate_slots(second, second.num_tokens - 8, hits)
    bm.record_lookup(second.num_tokens, second.num_computed_tokens)
    assert second.num_computed_tokens == 8
    assert [bm.ref_count(b) for b in first.block_table[:2]] == [2, 2]
    assert bm.prefix_queries == 11 and bm.prefix_hits == 8


def test_prefix_cache_is_salted_per_tenant() -> None:
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    assert _prefill(bm, _seq(list(range(9)), salt=b"alice"))
    assert bm.find_cached_prefix(_seq(list(range(9)), salt=b"bob")) == []
    assert len(bm.find_cached_prefix(_seq(list(range(9)), salt=b"alice"))) == 2


def test_freed_cached_blocks_are_reused_in_lru_order() -> None:
    bm = BlockManager(4, BS, enable_prefix_caching=True)
    old = _seq([1] * 5)
    assert _prefill(bm, old)  # blocks: one full (cached), one partial
    bm.free(old)
    assert bm.num_free_blocks == 4  # the cached block is free, just not forgotten
    again = _seq([1] * 5)
    assert len(bm.find_cached_prefix(again)) == 1  # still a hit after the free
    bm.free(again)
    filler = _seq(list(range(100, 116)))  # needs all 4 blocks: the cached one is evicted
    assert _prefill(bm, filler)
    assert bm.find_cached_prefix(_seq([1] * 5)) == []
    bm.free(filler)


def test_fully_cached_prompt_leaves_its_last_block_to_compute() -> None:
    bm = BlockManager(8, BS, enable_prefix_caching=True)
    assert _prefill(bm, _seq(list(range(8))))
    hits = bm.find_cached_prefix(_seq(list(range(8))))
    assert len(hits) == 1  # 2 full blocks cached, but the sampler needs the last logits


def test_fork_shares_blocks_and_writing_copies_the_shared_tail() -> None:
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    parent = _seq(list(range(6)))
    assert _prefill(bm, parent)
    child = parent.fork(1, None)
    bm.fork(parent, child)
    assert child.block_table == parent.block_table
    assert all(bm.ref_count(b) == 2 for b in parent.block_table)
    child.output_token_ids.append(7)  # the next write lands in the shared partial block
    assert bm.allocate_slots(child, 1)
    assert child.block_table[0] == parent.block_table[0]  # the full block stays shared
    assert child.block_table[1] != parent.block_table[1]
    assert bm.pop_copies() == [(parent.block_table[1], child.block_table[1])]
    assert bm.ref_count(parent.block_table[1]) == 1
    parent.output_token_ids.append(8)
    assert bm.allocate_slots(parent, 1)  # now sole owner: no copy
    assert bm.pop_copies() == []
    bm.free(child)
    bm.free(parent)
    assert bm.num_free_blocks == 8


def test_reserve_keeps_a_watermark_free() -> None:
    bm = BlockManager(4, BS, enable_prefix_caching=False)
    assert not _prefill(bm, _seq(list(range(12))), reserve=2)
    assert _prefill(bm, _seq(list(range(12))), reserve=1)
