"""Which ready worker takes a request: prefix affinity first, load when that worker is full.

Pure functions over `Candidate`s, so the rules are unit-tested without any
process. The affinity key hashes the first full KV blocks of the prompt
(and the tenant: the engine's prefix cache is per tenant), and rendezvous
(highest-random-weight) hashing maps it to a worker: requests that share a
long prefix land where its blocks are cached, and when a worker joins or
leaves only the keys it wins or held move. A worker that is full (its
slots taken, or its KV cache nearly full with requests waiting) is skipped
for the least-loaded one, like llm-d's prefix-aware scorer with a load filter.

A request with a LoRA adapter goes first to the workers that report it loaded (and
are not full): another worker would have to read it from disk first, and its cached
prefix blocks of that adapter are there too (the engine keys them by adapter, and so
does the affinity key). Among those, the same rules pick; with none, all workers are
candidates and the one chosen loads it.
"""

from __future__ import annotations

import hashlib
import random
import struct
from collections.abc import Sequence
from dataclasses import dataclass

BLOCK_SIZE = 16
KV_FULL = 0.92  # the field's threshold: above it, new requests queue or preempt


@dataclass(frozen=True)
class Candidate:
    worker_id: str
    capacity: int  # the worker's max running sequences
    inflight: int  # requests this gateway has on it now
    reported_running: int = 0  # from its heartbeat (all gateways)
    reported_waiting: int = 0
    kv_usage: float = 0.0
    adapters: frozenset[str] = frozenset()  # the LoRA adapters it reports loaded

    @property
    def busy(self) -> int:
        """Requests it holds: the larger of what it reported and what we sent it since."""
        return max(self.inflight, self.reported_running + self.reported_waiting)

    @property
    def full(self) -> bool:
        if self.busy >= self.capacity:
            return True
        return self.kv_usage >= KV_FULL and self.reported_waiting > 0

    @property
    def load(self) -> float:
        """Comparable across workers of different sizes: share of slots taken, plus KV pressure."""
        return self.busy / max(1, self.capacity) + self.kv_usage + self.reported_waiting


def prefix_key(
    tenant_id: str,
    prompt_token_ids: Sequence[int],
    max_blocks: int,
    block_size: int = BLOCK_SIZE,
    adapter: str | None = None,
) -> bytes | None:
    """A digest of the prompt's first full blocks (at most `max_blocks`), or None if it has
    none; per adapter too (an adapter's KV is not the base model's)."""
    blocks = min(max_blocks, len(prompt_token_ids) // block_size)
    if blocks <= 0:
        return None
    digest = hashlib.blake2b(tenant_id.encode(), digest_size=16)
    if adapter is not None:
        digest.update(b"\0adapter\0" + adapter.encode())
    digest.update(blocks.to_bytes(4, "little"))
    count = blocks * block_size  # each id as 4 bytes, little-endian, signed: one C call
    digest.update(struct.pack(f"<{count}i", *prompt_token_ids[:count]))
    return digest.digest()


def rendezvous_order(key: bytes, worker_ids: Sequence[str]) -> list[str]:
    """Workers by decreasing weight for `key`: the first is the key's home."""

    def weight(worker_id: str) -> bytes:
        return hashlib.blake2b(key + worker_id.encode(), digest_size=8).digest()

    return sorted(worker_ids, key=weight, reverse=True)


def choose(
    candidates: Sequence[Candidate],
    key: bytes | None,
    rng: random.Random | None = None,
    adapter: str | None = None,
) -> Candidate | None:
    """The worker for a request: its prefix home unless full, else the least loaded; for an
    adapter, among the workers that have it loaded when any of them has room."""
    if not candidates:
        return None
    if adapter is not None:
        loaded = [c for c in candidates if adapter in c.adapters and not c.full]
        if loaded:
            candidates = loaded
    by_id = {c.worker_id: c for c in candidates}
    if key is not None:
        home = by_id[rendezvous_order(key, list(by_id))[0]]
        if not home.full:
            return home
    room = [c for c in candidates if not c.full] or list(candidates)
    lowest = min(c.load for c in room)
    tied = [c for c in room if c.load <= lowest + 1e-9]
    return (rng or random).choice(tied)
