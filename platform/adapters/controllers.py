"""Routes: `/admin/models/{base}/adapters` (register, list) and `.../{name}` (remove)."""

from __future__ import annotations

from litestar import Controller, delete, get, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, JSONBody

from hydrant.platform.adapters.deps import provide_adapter_service
from hydrant.platform.adapters.schemas import AdapterCreate, AdapterList, AdapterView
from hydrant.platform.adapters.service import AdapterService
from hydrant.platform.auth.dependencies import provide_admin_principal, require_admin


class AdapterAdminController(Controller):
    path = "/admin/models/{base:str}/adapters"
    guards = [require_admin]
    dependencies = {
        "principal": Provide(provide_admin_principal),
        "adapters": Provide(provide_adapter_service),
    }

    @post("/")
    async def register_adapter(
        self,
        base: FromPath[str],
        data: JSONBody[AdapterCreate],
        adapters: NamedDependency[AdapterService],
    ) -> AdapterView:
        return AdapterView.of(*await adapters.register(base, data))

    @get("/")
    async def list_adapters(
        self, base: FromPath[str], adapters: NamedDependency[AdapterService]
    ) -> AdapterList:
        return AdapterList(data=[AdapterView.of(*a) for a in await adapters.list_of(base)])

    @delete("/{name:str}")
    async def remove_adapter(
        self, base: FromPath[str], name: FromPath[str], adapters: NamedDependency[AdapterService]
    ) -> None:
        await adapters.remove(base, name)
