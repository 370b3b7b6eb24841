"""vLLM's `POST /tokenize` and `POST /detokenize`: a model's own token counts, free.

Quotas and prices go by tokens of the model's tokenizer and chat template, which a
client cannot reproduce with tiktoken; these give the exact count before a request
is sent. A chat body (`messages`, with `tools` and `chat_template_kwargs`) is
rendered and encoded exactly as `/v1/chat/completions` would; a `prompt` as
`/v1/completions` would (special tokens added unless `add_special_tokens` is
false). Nothing runs on the engine and nothing is billed; the key must still be
valid and allowed the model.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from litestar import Controller, Request, post
from litestar.di import NamedDependency

from hydrant.platform.auth.principal import Principal
from hydrant.platform.errors import InvalidRequest
from hydrant.platform.http.openapi import raw_json_body_operation
from hydrant.platform.inference.chat.prepare import chat_prompt
from hydrant.platform.inference.deps import InferenceApi
from hydrant.platform.inference.params import check_token_ids
from hydrant.platform.inference.render import token_piece
from hydrant.platform.inference.schemas import ChatCompletionRequest, decode_body
from hydrant.platform.inference.serving import served_model

MAX_DETOKENIZE = 1_000_000  # ids in one request (a 4 MiB body holds fewer)


class TokenizePrompt(msgspec.Struct, kw_only=True):
    model: str
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeResponse(msgspec.Struct, kw_only=True):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    model: str
    tokens: list[int]


class DetokenizeResponse(msgspec.Struct, kw_only=True):
    prompt: str


def _is_chat(raw: bytes) -> bool:
    try:
        probe = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return False  # decode_body reports it, in the API's words
    return isinstance(probe, dict) and "messages" in probe


def _tokenize(raw: bytes, api: InferenceApi, principal: Principal) -> TokenizeResponse:
    if _is_chat(raw):
        chat = decode_body(raw, ChatCompletionRequest)
        model = served_model(api, principal, chat.model)
        ids = chat_prompt(chat, model).token_ids
        strs = False
    else:
        request = decode_body(raw, TokenizePrompt)
        model = served_model(api, principal, request.model)
        ids = model.tokenizer.encode(request.prompt, add_special_tokens=request.add_special_tokens)
        strs = request.return_token_strs
    return TokenizeResponse(
        count=len(ids),
        max_model_len=model.max_model_len,
        tokens=ids,
        token_strs=[token_piece(model.tokenizer, t)[0] for t in ids] if strs else None,
    )


def _detokenize(raw: bytes, api: InferenceApi, principal: Principal) -> DetokenizeResponse:
    request = decode_body(raw, DetokenizeRequest)
    model = served_model(api, principal, request.model)
    vocab = model.tokenizer.vocab_size
    if len(request.tokens) > MAX_DETOKENIZE:
        raise InvalidRequest(f"tokens takes at most {MAX_DETOKENIZE} ids", param="tokens")
    check_token_ids(request.tokens, vocab, "tokens", "tokens")
    return DetokenizeResponse(prompt=model.tokenizer.decode(request.tokens))


class TokenizationController(Controller):
    path = "/"

    @post(
        "/tokenize",
        status_code=200,
        operation_class=raw_json_body_operation(TokenizePrompt, streams=False),
    )
    async def tokenize(
        self,
        request: Request[Any, Any, Any],
        inference: NamedDependency[InferenceApi],
        principal: NamedDependency[Principal],
    ) -> TokenizeResponse:
        raw = await request.body()
        # A 4 MiB body is a fraction of a second of tokenizing: off the event loop.
        return await asyncio.to_thread(_tokenize, raw, inference, principal)

    @post(
        "/detokenize",
        status_code=200,
        operation_class=raw_json_body_operation(DetokenizeRequest, streams=False),
    )
    async def detokenize(
        self,
        request: Request[Any, Any, Any],
        inference: NamedDependency[InferenceApi],
        principal: NamedDependency[Principal],
    ) -> DetokenizeResponse:
        raw = await request.body()
        return await asyncio.to_thread(_detokenize, raw, inference, principal)
