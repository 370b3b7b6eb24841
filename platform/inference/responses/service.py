"""The Responses API's rules around the request path: which conversation a turn continues,
whether its answer is kept, and the pages of a stored answer's input items."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal

import msgspec

from hydrant.platform.errors import InvalidRequest
from hydrant.platform.inference.responses.prepare import ResponsesRequest
from hydrant.platform.inference.responses.store import ResponseStore, input_items

Keep = Callable[[dict[str, Any]], Awaitable[bool]]


async def continue_conversation(
    store: ResponseStore, tenant_id: str | None, body: ResponsesRequest
) -> tuple[ResponsesRequest, Keep | None]:
    """The request with the whole conversation as its input (a `previous_response_id`'s
    chain first), and how to keep its answer (None: not stored, as `store: false` asks,
    or for a key of no tenant)."""
    items = input_items(body.input)
    if body.previous_response_id is not None:
        items = [*await store.history(tenant_id, body.previous_response_id), *items]
    kept = store.enabled and tenant_id is not None and body.store is not False
    body = msgspec.structs.replace(body, input=items, previous_response_id=None, store=kept)
    if not kept or tenant_id is None:
        return body, None
    owner = tenant_id

    async def keep(response: dict[str, Any]) -> bool:
        return await store.save(owner, response, items)

    return body, keep


async def input_items_page(
    store: ResponseStore,
    tenant_id: str | None,
    response_id: str,
    order: Literal["asc", "desc"],
    limit: int,
    after: str | None,
) -> dict[str, Any]:
    """The input items a stored answer answered (earlier turns of its chain included),
    OpenAI's cursor page: newest first unless `order` is asc."""
    if not 1 <= limit <= 100:
        raise InvalidRequest("limit must be between 1 and 100", param="limit")
    items = list((await store.get(tenant_id, response_id)).input_items)
    if order == "desc":
        items.reverse()
    ids = [item.get("id") if isinstance(item, dict) else None for item in items]
    if after is not None:
        if after not in ids:
            raise InvalidRequest(f"no input item {after!r} in this response", param="after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0].get("id") if page else None,
        "last_id": page[-1].get("id") if page else None,
        "has_more": len(items) > len(page),
    }
