"""The request path every `/v1` surface shares: model lookup, preparation, screening,
admission and dispatch, then the surface's rendering, whole or streamed.

Each surface (chat/, completions/, responses/, embeddings/) is an `Endpoint`:
its body type, how it prepares a request and how it renders the answer. The
rules live in params.py and service.py; this module only runs them in order.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from litestar import Request
from litestar.background_tasks import BackgroundTask
from litestar.response import Response, Stream

from hydrant.engine.protocol import AdapterRef
from hydrant.engine.tokenizer import Tokenizer
from hydrant.platform.auth.principal import Principal
from hydrant.platform.db.base import utcnow
from hydrant.platform.errors import PermissionDenied
from hydrant.platform.http.disconnect import unless_client_leaves
from hydrant.platform.http.request_id import request_id_for
from hydrant.platform.inference.deps import InferenceApi
from hydrant.platform.inference.params import PreparedRequest, check_constraint
from hydrant.platform.inference.schemas import decode_body
from hydrant.platform.inference.service import Generation
from hydrant.platform.ledger.accounting import LedgerWriter
from hydrant.platform.ledger.attribution import TAGS_HEADER, Attribution, merge_tags
from hydrant.platform.models.registry import ServedModel
from hydrant.platform.quotas.admission import BATCH_PRIORITY, BatchTicket, RequestContext
from hydrant.platform.quotas.ingest_order import arrival

SSE_HEADERS = {
    # Set here, not only as `media_type`: Litestar lets the handler's (JSON) media type win
    # over a `Stream`'s, and SSE clients and proxies go by this header.
    "content-type": "text/event-stream; charset=utf-8",
    "cache-control": "no-cache",
    "x-accel-buffering": "no",
}


def served_model(api: InferenceApi, principal: Principal, name: str) -> ServedModel:
    """The model a request names, if this gateway serves it (404) and the key may use it (403).

    A LoRA adapter (`base:adapter`, or its name alone) is the base model's entry with the
    adapter attached; another tenant's adapter is answered exactly as an unknown model."""
    model = api.registry.find(name)
    if model is None and api.adapters is not None:
        entry = api.adapters.resolve(name, principal.tenant_id, api.registry.names())
        if entry is not None:
            base = api.registry.get(entry.base_model)
            model = replace(base, adapter=entry.ref)
    if model is None:
        model = api.registry.get(name)  # 404 model_not_found
    check_model_allowed(principal, model.name, model.adapter)
    return model


def check_model_allowed(
    principal: Principal, model: str, adapter: AdapterRef | None = None
) -> None:
    """A plan's model list allows an adapter by its own name or by its base model's."""
    allowed = principal.allowed_models
    if allowed is None or model in allowed or (adapter is not None and adapter.name in allowed):
        return
    name = adapter.name if adapter is not None else model
    raise PermissionDenied(
        f"your plan does not include the model `{name}`",
        param="model",
        code="model_not_allowed",
    )


def _context(
    request_id: str,
    principal: Principal,
    model: ServedModel,
    prepared: PreparedRequest,
    priority: int,
    batch: BatchTicket | None = None,
    attribution: Attribution | None = None,
) -> RequestContext[PreparedRequest]:
    if attribution is None and principal.project is not None:
        attribution = Attribution(project_id=principal.project_id)
    return RequestContext(
        request_id=request_id,
        tenant_id=principal.tenant_id or "admin",
        api_key_id=principal.key_id,
        key_prefix=principal.key_prefix,
        model=model.name,
        prepared=prepared,
        tenant_weight=principal.weight,
        priority=priority,
        plan=principal.plan,
        max_model_len=model.max_model_len,
        batch=batch,
        # Adapter names hold no `:`, base names may: the part after the last one.
        adapter=model.adapter.name.rpartition(":")[2] if model.adapter else None,
        attribution=attribution,
        project=principal.project,
        key_quota=principal.key_quota,
        # from its arrival: a wait for its place in the admission path is gateway time too
        started_at=arrival() or utcnow(),
    )


def attribution_of(
    api: InferenceApi, principal: Principal, body: Any, tags_header: str | None
) -> Attribution | None:
    """The request's project (its key's), hashed end user and tags, checked (400 naming
    the param). The end user is `safety_identifier` (OpenAI's newer name) or `user`."""
    end_user = None
    param = "safety_identifier"
    raw_user = getattr(body, param, None)
    if raw_user is None:
        param = "user"
        raw_user = getattr(body, param, None)
    if raw_user is not None and principal.tenant_id is not None and api.end_users is not None:
        end_user = api.end_users.hash(principal.tenant_id, raw_user, param)
    tags = merge_tags(getattr(body, "metadata", None), tags_header)
    if end_user is None and tags is None and principal.project is None:
        return None
    return Attribution(project_id=principal.project_id, end_user=end_user, tags=tags)


def _screen(
    api: InferenceApi, principal: Principal, model: ServedModel, prepared: PreparedRequest
) -> None:
    for prompt in prepared.prompts:
        api.abuse.check(
            principal.key_id,
            prompt.token_ids,
            model.tokenizer.special_token_ids,
            param=prepared.prompt_field,
        )


@dataclass(frozen=True)
class Endpoint:
    """What differs between the surfaces; the request path is shared."""

    body: type[Any]  # a msgspec struct with `model` and `priority`
    prepare: Callable[[Any, ServedModel, int], PreparedRequest]
    whole: Callable[[Generation, Tokenizer], Awaitable[object]]
    stream: Callable[[Generation, Tokenizer], AsyncIterator[bytes]] | None = None
    # A step between the decoded body and the shared path: the body (and this endpoint)
    # as they go on (the Responses API continues a stored conversation here).
    resolve: Callable[[InferenceApi, Principal, Any], Awaitable[tuple[Any, Endpoint]]] | None = None


@dataclass(frozen=True)
class Answer:
    """A request's answer before its first byte: a whole body or a stream, with the headers
    either carries. What the Litestar handler and the lean ASGI path (lean_path.py) each
    write out their own way."""

    headers: dict[str, str]
    body: object = None  # the whole answer (a msgspec struct), when not streamed
    stream: AsyncIterator[bytes] | None = None  # SSE events, each one whole
    generation: Generation | None = None  # a stream's: settled however the stream ends


async def serve(
    request: Request[Any, Any, Any], api: InferenceApi, principal: Principal, endpoint: Endpoint
) -> Any:
    """The Litestar handlers' path (the lean path, lean_path.py, answers most requests of
    the same routes before Litestar's own layers: both run `answer_request`)."""
    answer = await answer_request(request, api, principal, endpoint)
    if answer.stream is not None and answer.generation is not None:
        return Stream(
            answer.stream,
            media_type="text/event-stream",
            headers=answer.headers,
            background=BackgroundTask(answer.generation.aclose),  # however the stream ended
        )
    return Response(answer.body, headers=answer.headers)


def prepare_body(
    api: InferenceApi, principal: Principal, endpoint: Endpoint, body: Any
) -> tuple[ServedModel, PreparedRequest]:
    """The model a body names and the request prepared from it (tokenized, checked): what
    the Batch API also runs on every line of a batch when it is made."""
    model = served_model(api, principal, body.model)
    return model, endpoint.prepare(body, model, api.default_max_tokens)


async def start_body(
    api: InferenceApi,
    principal: Principal,
    endpoint: Endpoint,
    body: Any,
    request_id: str,
    attribution: Attribution | None = None,
) -> tuple[Generation, ServedModel, PreparedRequest]:
    """The request path up to the first chunk, for a `/v1` request."""
    model, prepared = prepare_body(api, principal, endpoint, body)
    generation = await start_prepared(
        api, principal, model, prepared, request_id, priority=body.priority, attribution=attribution
    )
    return generation, model, prepared


async def start_prepared(
    api: InferenceApi,
    principal: Principal,
    model: ServedModel,
    prepared: PreparedRequest,
    request_id: str,
    *,
    priority: int,
    batch: BatchTicket | None = None,
    ledger: LedgerWriter | None = None,
    attribution: Attribution | None = None,
) -> Generation:
    """A prepared request screened, admitted and started: the path every request takes,
    a Batch API line too (`batch`: at the lowest engine priority, through the gate's
    batch lane; `ledger`: where its one entry goes, see `InferenceService.start`)."""
    await check_constraint(prepared)
    _screen(api, principal, model, prepared)
    if batch is not None:
        priority = BATCH_PRIORITY
    ctx = _context(request_id, principal, model, prepared, priority, batch, attribution)
    return await api.service.start(ctx, model, ledger=ledger)


async def answer_request(
    request: Request[Any, Any, Any], api: InferenceApi, principal: Principal, endpoint: Endpoint
) -> Answer:
    """The request's body read and decoded, then run to its answer. Until the answer starts,
    a client that disconnects stops the work (`unless_client_leaves`): while it waits for
    admission or its first token, and through a whole (non-streamed) generation; once a
    stream starts, its writer's own disconnect watch takes over."""
    body = decode_body(await request.body(), endpoint.body)
    if endpoint.resolve is not None:
        body, endpoint = await endpoint.resolve(api, principal, body)
    attribution = attribution_of(api, principal, body, request.headers.get(TAGS_HEADER))
    request_id = request_id_for(request.scope)

    async def run() -> Answer:
        generation, model, prepared = await start_body(
            api, principal, endpoint, body, request_id, attribution
        )
        limits = generation.rate_limit_headers
        if prepared.stream and endpoint.stream is not None:
            return Answer(
                {**SSE_HEADERS, **limits},
                stream=endpoint.stream(generation, model.tokenizer),
                generation=generation,
            )
        return Answer(dict(limits), body=await endpoint.whole(generation, model.tokenizer))

    return await unless_client_leaves(request.receive, run())
