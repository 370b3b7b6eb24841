"""Route: `POST /v1/completions` (OpenAI's legacy completions, whole or streamed)."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, post
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec

from hydrant.platform.auth.principal import Principal
from hydrant.platform.http.openapi import raw_json_body_operation
from hydrant.platform.inference.completions.prepare import prepare_completion
from hydrant.platform.inference.completions.render import completion_stream, text_completion
from hydrant.platform.inference.deps import InferenceApi
from hydrant.platform.inference.schemas import Completion, CompletionRequest
from hydrant.platform.inference.serving import Endpoint, serve

TEXT = Endpoint(CompletionRequest, prepare_completion, text_completion, completion_stream)


def _document_completion_rules(schema: dict[str, Any]) -> None:
    """What `prepare_completion` checks: a prompt is a non-empty string (or token ids)."""
    for variant in schema["properties"]["prompt"].get("anyOf", []):
        if variant.get("type") == "string":
            variant["minLength"] = 1


class CompletionsController(Controller):
    path = "/v1"

    @post(
        "/completions",
        status_code=200,
        operation_class=raw_json_body_operation(
            CompletionRequest, streams=True, refine=_document_completion_rules
        ),
        responses={200: ResponseSpec(Completion, description="The completion (or SSE)")},
    )
    async def completions(
        self,
        request: Request[Any, Any, Any],
        inference: NamedDependency[InferenceApi],
        principal: NamedDependency[Principal],
    ) -> Any:
        return await serve(request, inference, principal, TEXT)
