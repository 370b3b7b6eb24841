"""Route: `POST /v1/chat/completions` (OpenAI's chat completions, whole or streamed)."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, post
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec

from hydrant.platform.auth.principal import Principal
from hydrant.platform.http.openapi import raw_json_body_operation
from hydrant.platform.inference.chat.prepare import ROLES, prepare_chat
from hydrant.platform.inference.chat.render import chat_completion, chat_stream
from hydrant.platform.inference.deps import InferenceApi
from hydrant.platform.inference.schemas import ChatCompletion, ChatCompletionRequest
from hydrant.platform.inference.serving import Endpoint, serve

CHAT = Endpoint(ChatCompletionRequest, prepare_chat, chat_completion, chat_stream)


def _document_chat_rules(schema: dict[str, Any]) -> None:
    """What `prepare_chat` checks, in the OpenAPI schema: at least one message, each with a
    known role."""
    messages = schema["properties"]["messages"]
    messages["minItems"] = 1
    messages["items"]["properties"]["role"]["enum"] = sorted(ROLES)


class ChatController(Controller):
    path = "/v1/chat"

    @post(
        "/completions",
        status_code=200,
        operation_class=raw_json_body_operation(
            ChatCompletionRequest, streams=True, refine=_document_chat_rules
        ),
        responses={200: ResponseSpec(ChatCompletion, description="The completion (or SSE)")},
    )
    async def chat_completions(
        self,
        request: Request[Any, Any, Any],
        inference: NamedDependency[InferenceApi],
        principal: NamedDependency[Principal],
    ) -> Any:
        return await serve(request, inference, principal, CHAT)
