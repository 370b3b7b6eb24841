"""Routes: OpenAI's Responses API, `POST /v1/responses` and its stored answers
(`GET`/`DELETE /v1/responses/{id}`, `GET .../input_items`)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Literal

from litestar import Controller, Request, delete, get, post
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import FromPath, FromQuery
from litestar.response import Response

from hydrant.platform.auth.principal import Principal
from hydrant.platform.http.openapi import raw_json_body_operation
from hydrant.platform.inference.deps import InferenceApi
from hydrant.platform.inference.responses.prepare import ResponsesRequest, prepare_response
from hydrant.platform.inference.responses.render import response_stream, response_whole
from hydrant.platform.inference.responses.service import (
    continue_conversation,
    input_items_page,
)
from hydrant.platform.inference.serving import Endpoint, serve


async def _continue(
    api: InferenceApi, principal: Principal, body: ResponsesRequest
) -> tuple[ResponsesRequest, Endpoint]:
    """A request that continues a stored conversation (`previous_response_id`), with the
    conversation's messages in its input, and an endpoint that stores the answer unless
    `store` is false (store.py)."""
    body, keep = await continue_conversation(api.responses, principal.tenant_id, body)
    if keep is None:
        return body, RESPONSES
    endpoint = dataclasses.replace(
        RESPONSES,
        whole=functools.partial(response_whole, keep=keep),
        stream=functools.partial(response_stream, keep=keep),
    )
    return body, endpoint


RESPONSES = Endpoint(
    ResponsesRequest, prepare_response, response_whole, response_stream, resolve=_continue
)


class ResponsesController(Controller):
    path = "/v1/responses"

    @post(
        "/",
        status_code=200,
        operation_class=raw_json_body_operation(ResponsesRequest, streams=True),
        responses={200: ResponseSpec(dict[str, Any], description="The response (or SSE)")},
    )
    async def responses(
        self,
        request: Request[Any, Any, Any],
        inference: NamedDependency[InferenceApi],
        principal: NamedDependency[Principal],
    ) -> Any:
        """OpenAI's Responses API (prepare.py), its answers stored unless `store` is false
        (store.py)."""
        return await serve(request, inference, principal, RESPONSES)

    @get("/{response_id:str}")
    async def retrieve_response(
        self,
        response_id: FromPath[str],
        inference: NamedDependency[InferenceApi],
        principal: NamedDependency[Principal],
    ) -> Any:
        """A stored answer, as it was returned (the tenant's own; else a 404)."""
        return Response((await inference.responses.get(principal.tenant_id, response_id)).body)

    @delete("/{response_id:str}", status_code=200)
    async def delete_response(
        self,
        response_id: FromPath[str],
        inference: NamedDependency[InferenceApi],
        principal: NamedDependency[Principal],
    ) -> dict[str, Any]:
        await inference.responses.delete(principal.tenant_id, response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    @get("/{response_id:str}/input_items")
    async def response_input_items(
        self,
        response_id: FromPath[str],
        inference: NamedDependency[InferenceApi],
        principal: NamedDependency[Principal],
        order: FromQuery[Literal["asc", "desc"]] = "desc",
        limit: FromQuery[int] = 20,
        after: FromQuery[str | None] = None,
    ) -> dict[str, Any]:
        """The input items a stored answer answered, OpenAI's cursor page."""
        return await input_items_page(
            inference.responses, principal.tenant_id, response_id, order, limit, after
        )
