"""Routes: OpenAI's Batch API, `/v1/batches` (create, retrieve, list, cancel)."""

from __future__ import annotations

from litestar import Controller, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery, JSONBody

from hydrant.platform.auth.principal import Principal
from hydrant.platform.batches.schemas import BatchCreate, BatchList, BatchObject
from hydrant.platform.batches.service import BatchService


class BatchesController(Controller):
    path = "/v1/batches"

    @post("/", status_code=200)
    async def create_batch(
        self,
        data: JSONBody[BatchCreate],
        batches: NamedDependency[BatchService],
        principal: NamedDependency[Principal],
    ) -> BatchObject:
        """A batch of the input file's requests: every line checked now (a bad one fails the
        batch, naming it), the maximum cost reserved, then run in spare capacity."""
        return BatchObject.of(await batches.create(principal, data))

    @get("/")
    async def list_batches(
        self,
        batches: NamedDependency[BatchService],
        principal: NamedDependency[Principal],
        limit: FromQuery[int] = 20,
        after: FromQuery[str | None] = None,
    ) -> BatchList:
        rows, more = await batches.page(principal, limit=limit, after=after)
        return BatchList.of(rows, more)

    @get("/{batch_id:str}")
    async def retrieve_batch(
        self,
        batch_id: FromPath[str],
        batches: NamedDependency[BatchService],
        principal: NamedDependency[Principal],
    ) -> BatchObject:
        return BatchObject.of(await batches.get(principal, batch_id))

    @post("/{batch_id:str}/cancel", status_code=200)
    async def cancel_batch(
        self,
        batch_id: FromPath[str],
        batches: NamedDependency[BatchService],
        principal: NamedDependency[Principal],
    ) -> BatchObject:
        """No new line starts; lines running are stopped unbilled; what was served is
        delivered when it is `cancelled`."""
        return BatchObject.of(await batches.cancel(principal, batch_id))
