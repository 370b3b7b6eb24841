"""Routing rules: prefix affinity by rendezvous hashing, load fallback when the home is full."""

from __future__ import annotations

import random

from hydrant.platform.dispatch.routing import Candidate, choose, prefix_key, rendezvous_order


def test_prefix_key_covers_full_blocks_only_and_the_tenant() -> None:
    prompt = list(range(100))
    assert prefix_key("t", prompt[:15], max_blocks=4) is None  # no full block
    # Same first 4 blocks, different tails: same key (the tail is not hashed).
    assert prefix_key("t", prompt, 4) == prefix_key("t", [*prompt[:64], 1, 2, 3], 4)
    assert prefix_key("t", prompt, 4) != prefix_key("u", prompt, 4)  # per-tenant cache
    assert prefix_key("t", prompt, 4) != prefix_key("t", [9, *prompt[1:]], 4)
    # Different numbers of full blocks below the cap: different keys.
    assert prefix_key("t", prompt[:32], 4) != prefix_key("t", prompt[:48], 4)


def test_rendezvous_moves_only_the_keys_of_a_worker_that_leaves() -> None:
    workers = [f"w{i}" for i in range(4)]
    keys = [bytes([i, j]) for i in range(20) for j in range(10)]
    before = {k: rendezvous_order(k, workers)[0] for k in keys}
    after = {k: rendezvous_order(k, workers[:3])[0] for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == "w3" for k in moved)
    counts = {w: sum(1 for v in before.values() if v == w) for w in workers}
    assert min(counts.values()) > len(keys) / 8  # spread, not all on one


def _c(worker_id: str, inflight: int = 0, capacity: int = 4, **kw: float) -> Candidate:
    return Candidate(worker_id=worker_id, capacity=capacity, inflight=inflight, **kw)  # type: ignore[arg-type]


def test_the_same_prefix_goes_to_the_same_worker() -> None:
    candidates = [_c("a"), _c("b"), _c("c")]
    key = prefix_key("t", list(range(64)), 4)
    picks = {choose(candidates, key).worker_id for _ in range(20)}  # type: ignore[union-attr]
    assert len(picks) == 1


def test_a_full_home_falls_back_to_the_least_loaded() -> None:
    key = prefix_key("t", list(range(64)), 4)
    assert key is not None
    home = rendezvous_order(key, ["a", "b", "c"])[0]
    others = [w for w in ("a", "b", "c") if w != home]
    candidates = [
        _c(home, inflight=4),  # all slots taken
        _c(others[0], inflight=2),
        _c(others[1], inflight=1),
    ]
    assert choose(candidates, key).worker_id == others[1]  # type: ignore[union-attr]
    # KV nearly full with requests waiting is full too.
    kv_full = [_c(home, kv_usage=0.97, reported_waiting=3), _c(others[0], inflight=3)]
    assert choose(kv_full, key).worker_id == others[0]  # type: ignore[union-attr]


def test_without_affinity_the_least_loaded_wins_and_ties_spread() -> None:
    assert choose([_c("a", 3), _c("b", 1)], None).worker_id == "b"  # type: ignore[union-attr]
    rng = random.Random(1)
    picks = {choose([_c("a"), _c("b")], None, rng).worker_id for _ in range(40)}  # type: ignore[union-attr]
    assert picks == {"a", "b"}
    assert choose([], None) is None
    # Everyone full: still the least loaded (the engine queues it) rather than nobody.
    assert choose([_c("a", 9), _c("b", 5)], None).worker_id == "b"  # type: ignore[union-attr]


def _with(worker_id: str, adapters: set[str], inflight: int = 0) -> Candidate:
    return Candidate(
        worker_id=worker_id, capacity=4, inflight=inflight, adapters=frozenset(adapters)
    )


def test_an_adapter_request_prefers_a_worker_that_has_it_loaded() -> None:
    rng = random.Random(0)
    # The loaded worker is busier, and no prefix key: without the adapter, `a` or `c` win.
    candidates = [_with("a", set()), _with("b", {"llama:sql"}, inflight=2), _with("c", set())]
    assert {choose(candidates, None, rng).worker_id for _ in range(20)} == {"a", "c"}  # type: ignore[union-attr]
    picks = {choose(candidates, None, rng, adapter="llama:sql").worker_id for _ in range(20)}  # type: ignore[union-attr]
    assert picks == {"b"}
    # Prefix affinity still decides among the workers that have it loaded.
    both = [_with("a", {"llama:sql"}), _with("b", {"llama:sql"}), _with("c", set())]
    key = prefix_key("t", list(range(64)), 4, adapter="llama:sql")
    assert key is not None
    home = rendezvous_order(key, ["a", "b"])[0]
    assert choose(both, key, rng, adapter="llama:sql").worker_id == home  # type: ignore[union-attr]


def test_a_full_worker_with_the_adapter_is_passed_over_and_keys_differ_by_adapter() -> None:
    rng = random.Random(0)
    candidates = [_with("a", {"llama:sql"}, inflight=4), _with("b", set(), inflight=1)]
    assert choose(candidates, None, rng, adapter="llama:sql").worker_id == "b"  # type: ignore[union-attr]
    prompt = list(range(64))
    assert prefix_key("t", prompt, 4) != prefix_key("t", prompt, 4, adapter="llama:sql")
    assert prefix_key("t", prompt, 4, adapter="x:a") != prefix_key("t", prompt, 4, adapter="x:b")
