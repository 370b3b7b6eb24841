"""Request and response bodies of the OpenAI-compatible API, as msgspec structs.

Requests are decoded by hand (`decode_body`) rather than by the framework so
every malformed body, wrong type or bad UTF-8 gets an OpenAI error object that
names the offending parameter. Unknown fields are ignored, as OpenAI does.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

import msgspec

from hydrant.platform.errors import InvalidRequest

T = TypeVar("T")


class TextPart(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class FunctionCall(msgspec.Struct, kw_only=True):
    name: str
    arguments: str  # JSON text, as the model wrote it


class ToolCall(msgspec.Struct, kw_only=True):
    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None  # a tool turn: the call it answers


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class SamplingFields(msgspec.Struct, kw_only=True):
    """Parameters shared by both endpoints, with Hydrant's (vLLM-style) extras."""

    model: str
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    user: str | None = None
    safety_identifier: str | None = None  # OpenAI's newer name for `user` (hashed, ledger)
    # OpenAI's (chat, with `store`); accepted on both for attribution: checked tags that
    # the ledger records and reports group by (ledger/attribution.py), never stored text.
    metadata: dict[str, Any] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool = False
    priority: int = 0
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None  # OpenAI's (on completions: vLLM's extension)
    structured_outputs: dict[str, Any] | None = None  # vLLM's: json, regex, choice, grammar
    truncate_prompt_tokens: int | None = None  # vLLM's: keep the prompt's last k tokens


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Any] | None = None  # checked by hand (chat/tools.py) to name the bad field
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's: e.g. {"enable_thinking": false}


class CompletionRequest(SamplingFields, kw_only=True):
    prompt: str | list[str | int | list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    # vLLM's: the token ids of the prompt and the output in the answer, and logprobs'
    # tokens as `token_id:N` (what a gateway fronting this server as an upstream asks).
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False


def decode_body(raw: bytes, kind: type[T]) -> T:
    """Decode a JSON body into `kind`, turning every failure into a 400 that names the field."""
    if not raw:
        raise InvalidRequest("request body is empty; send a JSON object")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"request body is not valid UTF-8 (byte {exc.start})") from exc
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as exc:
        message = str(exc)
        param = None
        if "at `$." in message:
            param = message.rsplit("at `$.", 1)[1].rstrip("`").split("[")[0].split(".")[0]
        elif message.startswith("Object missing required field `"):  # a top-level field
            param = message.split("`")[1]
        raise InvalidRequest(f"invalid request: {message}", param=param) from exc
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from exc


# ---- responses -------------------------------------------------------------------------


class TopLogprob(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChatLogprobs(msgspec.Struct, kw_only=True):
    content: list[ChatTokenLogprob]


class AssistantMessage(msgspec.Struct, kw_only=True, omit_defaults=True):
    """`tool_calls` is left out when there are none, as OpenAI does; `content` is null when
    the answer is only tool calls."""

    role: Literal["assistant"]
    content: str | None
    reasoning_content: str | None = None  # a thinking model's reasoning (chat/reasoning.py)
    tool_calls: list[ToolCall] | None = None


class ChatChoice(msgspec.Struct, kw_only=True):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class PromptTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int


class CompletionTokensDetails(msgspec.Struct, kw_only=True):
    reasoning_tokens: int


class Usage(msgspec.Struct, kw_only=True, omit_defaults=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    # A thinking model's (OpenAI's shape); left out for a model that does not think.
    completion_tokens_details: CompletionTokensDetails | None = None


class ChatCompletion(msgspec.Struct, kw_only=True):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: Literal["chat.completion"] = "chat.completion"
    system_fingerprint: str | None = None


class FunctionDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A streamed tool call: the first delta of call `index` carries its id, type and name;
    the following ones add to its arguments."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta | None = None


class ChatDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(msgspec.Struct, kw_only=True):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class ChatCompletionChunk(msgspec.Struct, kw_only=True):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    system_fingerprint: str | None = None
    usage: Usage | None = None


class CompletionLogprobs(msgspec.Struct, kw_only=True):
    """With `echo`, the prompt's tokens come first; the first has no logprob (null), as
    in OpenAI's legacy completions."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(msgspec.Struct, kw_only=True, omit_defaults=True):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None
    # vLLM's `return_token_ids`: the choice's tokens (a stream: this chunk's), and the
    # prompt's (a stream: in each choice's first chunk); left out unless asked for.
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None


class Completion(msgspec.Struct, kw_only=True):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    object: Literal["text_completion"] = "text_completion"
    system_fingerprint: str | None = None
    usage: Usage | None = None


class ModelCard(msgspec.Struct, kw_only=True):
    id: str
    created: int
    owned_by: str = "hydrant"
    object: Literal["model"] = "model"
    # A LoRA adapter's base model (vLLM lists its LoRA modules so); null for a base model.
    parent: str | None = None


class ModelList(msgspec.Struct, kw_only=True):
    data: list[ModelCard]
    object: Literal["list"] = "list"
