"""Admin views of the pools and the swap request."""

from __future__ import annotations

import msgspec

from hydrant.platform.dispatch.pool import WorkerPool


class WorkerView(msgspec.Struct, frozen=True, kw_only=True):
    worker_id: str
    kind: str  # `hydrant` (a worker) or `openai` (an upstream server)
    address: str
    device: str
    state: str
    path: str
    quantization: str | None
    inflight: int
    retired: bool
    kv_usage: float | None


class PoolView(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    kind: str  # `hydrant` (workers) or `openai` (upstream servers: no swap, no scale to zero)
    path: str
    quantization: str | None
    waiting: int
    swapping: bool
    workers: list[WorkerView]

    @classmethod
    def of(cls, pool: WorkerPool) -> PoolView:
        return cls(
            model=pool.model,
            kind=pool.kind,
            path=pool.spec.path,
            quantization=pool.spec.quantization,
            waiting=pool.waiting,
            swapping=pool.swapping,
            workers=[
                WorkerView(
                    worker_id=s.worker_id,
                    kind=s.record.kind,
                    address=s.record.address,
                    device=s.record.device,
                    state=s.record.state,
                    path=s.record.path,
                    quantization=s.record.quantization,
                    inflight=s.inflight,
                    retired=s.retired,
                    kv_usage=s.record.stats.kv_usage if s.record.stats else None,
                )
                for s in sorted(pool.workers.values(), key=lambda s: s.worker_id)
            ],
        )


class PoolList(msgspec.Struct, frozen=True, kw_only=True):
    data: list[PoolView]


class SwapRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    path: str
    quantization: str | None = None


class SwapResult(msgspec.Struct, frozen=True, kw_only=True):
    pool: PoolView
    drained: int
