"""vLLM's sleep-mode routes on `hydrant serve`: `POST /sleep`, `POST /wake_up`, `GET /is_sleeping`.

A gateway that fronts another Hydrant as an upstream pool
(`HYDRANT_POOL_BACKENDS`, `HYDRANT_UPSTREAM_SLEEP`) puts it to sleep and
wakes it with the calls it sends a vLLM, so one code path serves both kinds
of member (`dispatch.upstream_http`, `dispatch.upstream_health`). Here they
act on every worker pool this server dispatches to (the embedded default's
engine children included): sleep frees the device and keeps the weights in
host memory (the engine's sleep mode), a wake restores them.

Unlike vLLM's (unguarded, in its dev mode only), these take an admin key: a
tenant must not be able to put a shared server to sleep. A request that
reaches a sleeping server is not refused: its pool wakes for it, as any pool
scaled to zero does. Only level 1 exists (weights kept); vLLM's level 2
drops them for a caller that reloads its own.
"""

from __future__ import annotations

import asyncio
from typing import Literal

import msgspec
from litestar import Controller, get, post
from litestar.di import NamedDependency, Provide
from litestar.params import Parameter

from hydrant.platform.auth.dependencies import provide_admin_principal, require_admin
from hydrant.platform.dispatch.pool import WorkerPool
from hydrant.platform.dispatch.service import PoolManager
from hydrant.platform.errors import InvalidRequest, ServiceUnavailable


class SleepState(msgspec.Struct, frozen=True, kw_only=True):
    """vLLM's `is_sleeping`, and each model's pool state behind it."""

    is_sleeping: bool  # every model's pool asleep (vLLM's meaning: the whole server)
    models: dict[str, str]  # `ready`, `sleeping` or `starting` (no worker serving or asleep)


def _state(pool: WorkerPool) -> str:
    if pool.ready():
        return "ready"
    if pool.asleep():
        return "sleeping"
    return "starting"


def _pools(manager: PoolManager) -> list[WorkerPool]:
    """The pools this server runs engines for: an upstream pool's servers sleep by the
    calls of the gateway that fronts them, not through this one."""
    return [p for p in manager.pools.values() if p.kind == "hydrant"]


def sleep_state(manager: PoolManager) -> SleepState:
    models = {pool.model: _state(pool) for pool in _pools(manager)}
    asleep = bool(models) and all(state == "sleeping" for state in models.values())
    return SleepState(is_sleeping=asleep, models=models)


class SleepModeController(Controller):
    path = "/"
    guards = [require_admin]
    dependencies = {"principal": Provide(provide_admin_principal)}

    @post("/sleep", status_code=200)
    async def sleep(
        self,
        engine_pools: NamedDependency[PoolManager],
        level: int = Parameter(default=1, ge=1, le=2),
        mode: Literal["abort", "wait", "keep"] = Parameter(default="wait"),
    ) -> SleepState:
        """Put every model's workers to sleep now. Requests in flight finish first
        whatever vLLM's `mode` asks (a worker's sleep drains): accepted for its
        clients, but no tenant's request is cut off by an operator's sleep."""
        if level != 1:
            raise InvalidRequest(
                "only sleep level 1 exists here (weights kept in host memory); level 2 would"
                " drop the weights, which a server of tenants must not serve without",
                param="level",
            )
        await asyncio.gather(*(pool.sleep() for pool in _pools(engine_pools)))
        return sleep_state(engine_pools)

    @post("/wake_up", status_code=200)
    async def wake_up(
        self,
        engine_pools: NamedDependency[PoolManager],
        tags: list[str] | None = Parameter(default=None),
    ) -> SleepState:
        """Wake every model's workers and answer once they serve (vLLM's `tags`, parts
        to wake, are accepted and the whole engine woken: a wake here restores all)."""
        woken = await asyncio.gather(*(pool.wake() for pool in _pools(engine_pools)))
        state = sleep_state(engine_pools)
        if not all(woken):
            late = sorted(model for model, s in state.models.items() if s != "ready")
            raise ServiceUnavailable(
                f"not awake within the wake timeout: {', '.join(late)}; retry shortly",
                code="model_not_ready",
                retry_after=5.0,
            )
        return state

    @get("/is_sleeping")
    async def is_sleeping(self, engine_pools: NamedDependency[PoolManager]) -> SleepState:
        return sleep_state(engine_pools)
