"""Routes: `GET /admin/pools`, `POST /admin/pools/{model}/swap`, and draining one member
(`POST`/`DELETE /admin/pools/{model}/workers/{worker_id}/drain`); admin keys only."""

from __future__ import annotations

from litestar import Controller, delete, get, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, JSONBody
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.adapters.catalog import AdapterCatalog
from hydrant.platform.auth.dependencies import provide_admin_principal, require_admin
from hydrant.platform.dispatch.schemas import PoolList, PoolView, SwapRequest, SwapResult
from hydrant.platform.dispatch.service import PoolManager
from hydrant.platform.models.deployments import record_swap


class PoolAdminController(Controller):
    path = "/admin/pools"
    guards = [require_admin]
    dependencies = {"principal": Provide(provide_admin_principal)}

    @get("/")
    async def list_pools(self, pools: NamedDependency[PoolManager]) -> PoolList:
        return PoolList(data=[PoolView.of(p) for p in pools.pools.values()])

    @get("/{model:str}")
    async def get_pool(self, model: FromPath[str], pools: NamedDependency[PoolManager]) -> PoolView:
        return PoolView.of(pools.pool(model))

    @post("/{model:str}/swap", status_code=200)
    async def swap(
        self,
        model: FromPath[str],
        data: JSONBody[SwapRequest],
        pools: NamedDependency[PoolManager],
        adapter_catalog: NamedDependency[AdapterCatalog | None],
        db_session: NamedDependency[AsyncSession],
    ) -> SwapResult:
        """Start workers of the new checkpoint, wait until they serve, drain the old ones;
        the model's adapters stay registered and must fit the new checkpoint, which new
        adapters are then checked against."""
        manager = pools
        adapters = adapter_catalog.directories_of(model) if adapter_catalog is not None else {}
        drained = await manager.swap(model, data.path, data.quantization, adapters)
        await record_swap(db_session, model, data.path)
        return SwapResult(pool=PoolView.of(manager.pool(model)), drained=drained)

    @post("/{model:str}/workers/{worker_id:str}/drain", status_code=200)
    async def drain(
        self, model: FromPath[str], worker_id: FromPath[str], pools: NamedDependency[PoolManager]
    ) -> PoolView:
        """No new requests to this member; those in flight finish (a worker then exits)."""
        return PoolView.of(await pools.drain(model, worker_id))

    @delete("/{model:str}/workers/{worker_id:str}/drain", status_code=200)
    async def undrain(
        self, model: FromPath[str], worker_id: FromPath[str], pools: NamedDependency[PoolManager]
    ) -> PoolView:
        """Route to a drained upstream member again."""
        return PoolView.of(await pools.drain(model, worker_id, drained=False))
