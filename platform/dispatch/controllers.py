"""Routes: `GET /admin/pools` and `POST /admin/pools/{model}/swap` (admin keys only)."""

from __future__ import annotations

from litestar import Controller, Litestar, get, post
from litestar.datastructures import State
from litestar.di import Provide
from litestar.params import FromPath, JSONBody

from hydrant.platform.auth.dependencies import provide_admin_principal, require_admin
from hydrant.platform.dispatch.schemas import PoolList, PoolView, SwapRequest, SwapResult
from hydrant.platform.dispatch.service import PoolManager


def _manager(state: State) -> PoolManager:
    manager: PoolManager = state.pools
    return manager


class PoolAdminController(Controller):
    path = "/admin/pools"
    guards = [require_admin]
    dependencies = {"principal": Provide(provide_admin_principal)}

    @get("/")
    async def list_pools(self, state: State) -> PoolList:
        return PoolList(data=[PoolView.of(p) for p in _manager(state).pools.values()])

    @get("/{model:str}")
    async def get_pool(self, model: FromPath[str], state: State) -> PoolView:
        return PoolView.of(_manager(state).pool(model))

    @post("/{model:str}/swap", status_code=200)
    async def swap(
        self, model: FromPath[str], data: JSONBody[SwapRequest], state: State
    ) -> SwapResult:
        """Start workers of the new checkpoint, wait until they serve, drain the old ones."""
        manager = _manager(state)
        drained = await manager.swap(model, data.path, data.quantization)
        return SwapResult(pool=PoolView.of(manager.pool(model)), drained=drained)


def attach_pools(app: Litestar, manager: PoolManager) -> None:
    """Wire a pool manager into a gateway app: admin routes, start/stop, pool metrics."""
    app.state.pools = manager
    app.register(PoolAdminController)
    app.on_startup.append(manager.start)
    app.on_shutdown.append(manager.stop)
    registries = app.state.metric_registries
    if manager.metrics.registry not in registries:
        registries.append(manager.metrics.registry)
