"""Routes of the OpenAI-compatible API; the rules live in params.py and service.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from litestar import Controller, Request, get, post
from litestar.datastructures import State
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec
from litestar.response import Response, Stream

from hydrant.engine.tokenizer import Tokenizer
from hydrant.platform.auth.principal import Principal
from hydrant.platform.errors import PermissionDenied
from hydrant.platform.http.openapi import raw_json_body_operation
from hydrant.platform.http.request_id import request_id_for
from hydrant.platform.inference import render
from hydrant.platform.inference.abuse import AbuseGuard
from hydrant.platform.inference.accounting import RequestContext
from hydrant.platform.inference.params import (
    ROLES,
    PreparedRequest,
    prepare_chat,
    prepare_completion,
)
from hydrant.platform.inference.schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ModelCard,
    ModelList,
    decode_body,
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


def _check_model_allowed(principal: Principal, model: str) -> None:
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

    body: type[ChatCompletionRequest] | type[CompletionRequest]
    prepare: Callable[[Any, ServedModel, int], PreparedRequest]
    stream: Callable[[Generation, Tokenizer], AsyncIterator[bytes]]
    whole: Callable[[Generation, Tokenizer], Awaitable[object]]


CHAT = _Endpoint(ChatCompletionRequest, prepare_chat, render.chat_stream, render.chat_completion)
TEXT = _Endpoint(
    CompletionRequest, prepare_completion, render.completion_stream, render.text_completion
)


async def _serve(
    request: Request[Any, Any, Any], state: State, principal: Principal, endpoint: _Endpoint
) -> Any:
    body = decode_body(await request.body(), endpoint.body)
    registry: ModelRegistry = state.registry
    model = registry.get(body.model)
    _check_model_allowed(principal, model.name)
    prepared = endpoint.prepare(body, model, state.settings.default_max_tokens)
    _screen(state, principal, model, prepared)
    ctx = _context(request, principal, model, prepared)
    ctx.priority = body.priority
    service: InferenceService = state.inference
    generation = await service.start(ctx, model)
    if prepared.stream:
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
