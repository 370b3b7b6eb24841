"""Routes of the OpenAI-compatible API; the rules live in params.py and service.py."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
from litestar import Controller, Request, delete, get, post
from litestar.datastructures import State
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import FromPath, FromQuery
from litestar.response import Response, Stream

from hydrant.engine.tokenizer import Tokenizer
from hydrant.platform.auth.principal import Principal
from hydrant.platform.errors import InvalidRequest, PermissionDenied
from hydrant.platform.http.openapi import raw_json_body_operation
from hydrant.platform.http.request_id import request_id_for
from hydrant.platform.inference import render
from hydrant.platform.inference.abuse import AbuseGuard
from hydrant.platform.inference.accounting import RequestContext
from hydrant.platform.inference.embeddings import (
    ENCODINGS,
    EmbeddingList,
    EmbeddingRequest,
    embedding_list,
    prepare_embedding,
)
from hydrant.platform.inference.params import (
    ROLES,
    PreparedRequest,
    check_constraint,
    prepare_chat,
    prepare_completion,
)
from hydrant.platform.inference.responses_api import ResponsesRequest, prepare_response
from hydrant.platform.inference.responses_render import response_stream, response_whole
from hydrant.platform.inference.responses_store import ResponseStore, input_items
from hydrant.platform.inference.schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ModelCard,
    ModelList,
    decode_body,
)
from hydrant.platform.inference.scoring import (
    RerankRequest,
    ScoreRequest,
    prepare_rerank,
    prepare_score,
    rerank_results,
    score_list,
)
from hydrant.platform.inference.service import Generation, InferenceService
from hydrant.platform.models.registry import ModelRegistry, ServedModel

SSE_HEADERS = {
    # Set here, not only as `media_type`: Litestar lets the handler's (JSON) media type win
    # over a `Stream`'s, and SSE clients and proxies go by this header.
    "content-type": "text/event-stream; charset=utf-8",
    "cache-control": "no-cache",
    "x-accel-buffering": "no",
}


def served_model(state: State, principal: Principal, name: str) -> ServedModel:
    """The model a request names, if this gateway serves it (404) and the key may use it (403)."""
    registry: ModelRegistry = state.registry
    model = registry.get(name)  # 404 model_not_found
    check_model_allowed(principal, model.name)
    return model


def check_model_allowed(principal: Principal, model: str) -> None:
    allowed = principal.allowed_models
    if allowed is not None and model not in allowed:
        raise PermissionDenied(
            f"your plan does not include the model `{model}`",
            param="model",
            code="model_not_allowed",
        )


def _context(
    request: Request[Any, Any, Any],
    principal: NamedDependency[Principal],
    model: ServedModel,
    prepared: PreparedRequest,
) -> RequestContext:
    return RequestContext(
        request_id=request_id_for(request.scope),
        tenant_id=principal.tenant_id or "admin",
        api_key_id=principal.key_id,
        key_prefix=principal.key_prefix,
        model=model.name,
        prepared=prepared,
        tenant_weight=principal.weight,
        priority=0,
        plan=principal.plan,
        max_model_len=model.max_model_len,
    )


def _screen(
    state: State, principal: Principal, model: ServedModel, prepared: PreparedRequest
) -> None:
    guard: AbuseGuard = state.abuse
    for prompt in prepared.prompts:
        guard.check(
            principal.key_id,
            prompt.token_ids,
            model.tokenizer.special_token_ids,
            param=prepared.prompt_field,
        )


@dataclass(frozen=True)
class _Endpoint:
    """What differs between the two generation endpoints; the request path is shared."""

    body: (
        type[ChatCompletionRequest]
        | type[CompletionRequest]
        | type[ResponsesRequest]
        | type[EmbeddingRequest]
        | type[ScoreRequest]
        | type[RerankRequest]
    )
    prepare: Callable[[Any, ServedModel, int], PreparedRequest]
    whole: Callable[[Generation, Tokenizer], Awaitable[object]]
    stream: Callable[[Generation, Tokenizer], AsyncIterator[bytes]] | None = None


CHAT = _Endpoint(ChatCompletionRequest, prepare_chat, render.chat_completion, render.chat_stream)
TEXT = _Endpoint(
    CompletionRequest, prepare_completion, render.text_completion, render.completion_stream
)
RESPONSES = _Endpoint(ResponsesRequest, prepare_response, response_whole, response_stream)
EMBEDDINGS = _Endpoint(EmbeddingRequest, prepare_embedding, embedding_list)  # never streamed
SCORE = _Endpoint(ScoreRequest, prepare_score, score_list)
RERANK = _Endpoint(RerankRequest, prepare_rerank, rerank_results)


async def _serve(
    request: Request[Any, Any, Any], state: State, principal: Principal, endpoint: _Endpoint
) -> Any:
    body = decode_body(await request.body(), endpoint.body)
    return await _serve_body(request, state, principal, endpoint, body)


async def _serve_body(
    request: Request[Any, Any, Any],
    state: State,
    principal: Principal,
    endpoint: _Endpoint,
    body: Any,
) -> Any:
    model = served_model(state, principal, body.model)
    prepared = endpoint.prepare(body, model, state.settings.default_max_tokens)
    await check_constraint(prepared)
    _screen(state, principal, model, prepared)
    ctx = _context(request, principal, model, prepared)
    ctx.priority = body.priority
    service: InferenceService = state.inference
    generation = await service.start(ctx, model)
    if prepared.stream and endpoint.stream is not None:
        return Stream(
            endpoint.stream(generation, model.tokenizer),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )
    return Response(await endpoint.whole(generation, model.tokenizer))


def _document_chat_rules(schema: dict[str, Any]) -> None:
    """What `params.prepare_chat` checks, in the OpenAPI schema: at least one message,
    each with a known role."""
    messages = schema["properties"]["messages"]
    messages["minItems"] = 1
    messages["items"]["properties"]["role"]["enum"] = sorted(ROLES)


def _document_completion_rules(schema: dict[str, Any]) -> None:
    """What `params.prepare_completion` checks: a prompt is a non-empty string (or token ids)."""
    for variant in schema["properties"]["prompt"].get("anyOf", []):
        if variant.get("type") == "string":
            variant["minLength"] = 1


def _document_embedding_rules(schema: dict[str, Any]) -> None:
    """What `embeddings.prepare_embedding` checks: the encodings, and a positive size."""
    properties = schema["properties"]
    properties["encoding_format"]["enum"] = list(ENCODINGS)
    for variant in properties["dimensions"].get("anyOf", []):
        if variant.get("type") == "integer":
            variant["minimum"] = 1


class InferenceController(Controller):
    path = "/v1"

    @get("/models")
    async def list_models(self, state: State, principal: NamedDependency[Principal]) -> ModelList:
        registry: ModelRegistry = state.registry
        models = [
            m
            for m in registry.all()
            if principal.allowed_models is None or m.name in principal.allowed_models
        ]
        return ModelList(data=[ModelCard(id=m.name, created=m.created) for m in models])

    @get("/models/{model:path}")
    async def retrieve_model(
        self, model: FromPath[str], state: State, principal: NamedDependency[Principal]
    ) -> ModelCard:
        """OpenAI's "retrieve model"; a path parameter, since served names may hold a slash."""
        served = served_model(state, principal, model.lstrip("/"))
        return ModelCard(id=served.name, created=served.created)

    @post(
        "/chat/completions",
        status_code=200,
        operation_class=raw_json_body_operation(
            ChatCompletionRequest, streams=True, refine=_document_chat_rules
        ),
        responses={200: ResponseSpec(ChatCompletion, description="The completion (or SSE)")},
    )
    async def chat_completions(
        self, request: Request[Any, Any, Any], state: State, principal: NamedDependency[Principal]
    ) -> Any:
        return await _serve(request, state, principal, CHAT)

    @post(
        "/completions",
        status_code=200,
        operation_class=raw_json_body_operation(
            CompletionRequest, streams=True, refine=_document_completion_rules
        ),
        responses={200: ResponseSpec(Completion, description="The completion (or SSE)")},
    )
    async def completions(
        self, request: Request[Any, Any, Any], state: State, principal: NamedDependency[Principal]
    ) -> Any:
        return await _serve(request, state, principal, TEXT)

    @post(
        "/responses",
        status_code=200,
        operation_class=raw_json_body_operation(ResponsesRequest, streams=True),
        responses={200: ResponseSpec(dict[str, Any], description="The response (or SSE)")},
    )
    async def responses(
        self, request: Request[Any, Any, Any], state: State, principal: NamedDependency[Principal]
    ) -> Any:
        """OpenAI's Responses API (responses_api.py), its answers stored unless `store` is
        false (responses_store.py)."""
        body = decode_body(await request.body(), ResponsesRequest)
        store: ResponseStore = state.responses
        tenant = principal.tenant_id
        items = input_items(body.input)
        if body.previous_response_id is not None:
            items = [*await store.history(tenant, body.previous_response_id), *items]
        kept = store.enabled and tenant is not None and body.store is not False
        body = msgspec.structs.replace(body, input=items, previous_response_id=None, store=kept)
        endpoint = RESPONSES
        if kept and tenant is not None:

            async def keep(response: dict[str, Any]) -> bool:
                return await store.save(tenant, response, items)

            endpoint = dataclasses.replace(
                RESPONSES,
                whole=functools.partial(response_whole, keep=keep),
                stream=functools.partial(response_stream, keep=keep),
            )
        return await _serve_body(request, state, principal, endpoint, body)

    @get("/responses/{response_id:str}")
    async def retrieve_response(
        self, response_id: FromPath[str], state: State, principal: NamedDependency[Principal]
    ) -> Any:
        """A stored answer, as it was returned (the tenant's own; else a 404)."""
        store: ResponseStore = state.responses
        return Response((await store.get(principal.tenant_id, response_id)).body)

    @delete("/responses/{response_id:str}", status_code=200)
    async def delete_response(
        self, response_id: FromPath[str], state: State, principal: NamedDependency[Principal]
    ) -> dict[str, Any]:
        store: ResponseStore = state.responses
        await store.delete(principal.tenant_id, response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    @get("/responses/{response_id:str}/input_items")
    async def response_input_items(
        self,
        response_id: FromPath[str],
        state: State,
        principal: NamedDependency[Principal],
        order: FromQuery[Literal["asc", "desc"]] = "desc",
        limit: FromQuery[int] = 20,
        after: FromQuery[str | None] = None,
    ) -> dict[str, Any]:
        """The input items a stored answer answered (earlier turns of its chain included),
        OpenAI's cursor page: newest first unless `order` is asc."""
        if not 1 <= limit <= 100:
            raise InvalidRequest("limit must be between 1 and 100", param="limit")
        store: ResponseStore = state.responses
        items = list((await store.get(principal.tenant_id, response_id)).input_items)
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

    @post(
        "/embeddings",
        status_code=200,
        operation_class=raw_json_body_operation(
            EmbeddingRequest, streams=False, refine=_document_embedding_rules
        ),
        responses={200: ResponseSpec(EmbeddingList, description="One vector per input")},
    )
    async def embeddings(
        self, request: Request[Any, Any, Any], state: State, principal: NamedDependency[Principal]
    ) -> Any:
        """OpenAI's embeddings (embeddings.py): pooled as the checkpoint declares (the last
        token's state unless it says otherwise), normalized."""
        return await _serve(request, state, principal, EMBEDDINGS)


class ScoringController(Controller):
    """Score and rerank (scoring.py), on every path vLLM serves them on: under `/v1`, at
    the root, and Cohere's `/v2/rerank` (where a Cohere client pointed at Hydrant posts)."""

    path = "/"

    @post(
        ["/v1/score", "/score"],
        status_code=200,
        operation_class=raw_json_body_operation(ScoreRequest, streams=False),
        responses={200: ResponseSpec(dict[str, Any], description="One score per pair")},
    )
    async def score(
        self, request: Request[Any, Any, Any], state: State, principal: NamedDependency[Principal]
    ) -> Any:
        """vLLM's score: the cosine similarity of each pair's embeddings."""
        return await _serve(request, state, principal, SCORE)

    @post(
        ["/v1/rerank", "/rerank", "/v2/rerank"],
        status_code=200,
        operation_class=raw_json_body_operation(RerankRequest, streams=False),
        responses={200: ResponseSpec(dict[str, Any], description="Documents by relevance")},
    )
    async def rerank(
        self, request: Request[Any, Any, Any], state: State, principal: NamedDependency[Principal]
    ) -> Any:
        """Jina's and Cohere's rerank, as vLLM serves it: documents ordered by the cosine
        similarity of their embedding to the query's."""
        return await _serve(request, state, principal, RERANK)
