"""From a chat completion request to what the engine runs: the conversation rendered with
the model's chat template (tools and thinking included) and its sampling settings.

The Responses API prepares through here too (responses/prepare.py), so a chat
turn is metered the same whichever API carried it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hydrant.engine.errors import InvalidRequestError
from hydrant.platform.errors import InvalidRequest
from hydrant.platform.inference.chat.reasoning import constraint_after_thinking, reasoning_start
from hydrant.platform.inference.chat.tools import ChatTools, chat_tools, template_message
from hydrant.platform.inference.params import (
    PreparedPrompt,
    PreparedRequest,
    check_context,
    max_tokens_for,
    output_constraint,
    sampling_for,
    truncation,
)
from hydrant.platform.inference.schemas import ChatCompletionRequest, ChatMessage
from hydrant.platform.models.registry import ServedModel

ROLES = frozenset({"system", "user", "assistant", "developer", "tool"})


def _message_text(message: ChatMessage, index: int) -> str:
    if message.role not in ROLES:
        raise InvalidRequest(
            f"messages[{index}].role must be one of {', '.join(sorted(ROLES))}",
            param=f"messages[{index}].role",
        )
    if message.content is None:
        return ""
    if isinstance(message.content, str):
        return message.content
    parts = []
    for part in message.content:
        if part.type != "text" or part.text is None:
            raise InvalidRequest(
                f"messages[{index}].content: only text parts are supported, got {part.type!r}",
                param=f"messages[{index}].content",
            )
        parts.append(part.text)
    return "".join(parts)


# Names the template's own context holds: a request cannot replace them.
RESERVED_TEMPLATE_NAMES = frozenset({"messages", "tools", "documents", "add_generation_prompt"})


def _template_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
    if kwargs is None:
        return None
    reserved = sorted(RESERVED_TEMPLATE_NAMES & set(kwargs))
    if reserved:
        raise InvalidRequest(
            f"chat_template_kwargs cannot set {reserved[0]!r}; send it as its own field",
            param="chat_template_kwargs",
        )
    return kwargs


@dataclass(frozen=True)
class ChatPrompt:
    """A chat request's prompt as the model sees it, and what its tools amount to."""

    tools: ChatTools
    text: str
    token_ids: list[int]


def chat_prompt(request: ChatCompletionRequest, model: ServedModel) -> ChatPrompt:
    """The conversation and its tools, rendered with the model's template and encoded:
    what a chat request is metered with (and what `/tokenize` counts)."""
    tools = chat_tools(request, model.tokenizer.chat_template, model.tool_call_parser)
    if not request.messages:
        raise InvalidRequest("messages must contain at least one message", param="messages")
    conversation = []
    for i, m in enumerate(request.messages):
        # An assistant turn of tool calls alone has no content, which templates test for.
        content = None if m.content is None and m.tool_calls else _message_text(m, i)
        conversation.append(template_message(m, i, content))
    try:
        text, ids = model.tokenizer.render_chat(
            conversation,
            tools=tools.definitions,
            extra_context=_template_kwargs(request.chat_template_kwargs),
        )
    except InvalidRequestError as exc:
        raise InvalidRequest(exc.message, param=exc.param or "messages") from exc
    return ChatPrompt(tools, text, ids)


def prepare_chat(
    request: ChatCompletionRequest, model: ServedModel, default_max_tokens: int
) -> PreparedRequest:
    keep = truncation(request.truncate_prompt_tokens, model)
    prompt = chat_prompt(request, model)
    tools, ids = prompt.tools, prompt.token_ids
    if keep is not None:  # as vLLM: the rendered conversation's last tokens
        ids = ids[-keep:]
    asked = request.max_completion_tokens if request.max_completion_tokens is not None else None
    asked = request.max_tokens if asked is None else asked
    max_tokens = max_tokens_for(asked, default_max_tokens, len(ids), model)
    check_context(len(ids), max_tokens, model)
    if request.top_logprobs is not None and not request.logprobs:
        raise InvalidRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
    logprobs = (request.top_logprobs or 0) if request.logprobs else None
    constraint, field = output_constraint(request)
    if tools.constraint is not None:
        if constraint is not None:
            raise InvalidRequest(
                "tool_choice required or a named function fixes the output's form; it "
                f"cannot be combined with {field}",
                param="tool_choice",
            )
        constraint, field = tools.constraint, "tools"
    thinking = reasoning_start(model.tokenizer.chat_template, prompt.text)
    after = None
    if constraint is not None and thinking is not None:
        # The form holds once the model has thought (the engine waits for `</think>`), or,
        # where it cannot wait, from the first token, with no thinking in the output.
        after = constraint_after_thinking(model.tokenizer, prompt.text)
        thinking = thinking if after is not None else None
    sampling = sampling_for(
        request,
        max_tokens,
        logprobs,
        model,
        structured_output=constraint,
        structured_output_after=after,
    )
    return PreparedRequest(
        (PreparedPrompt(ids, sampling),),
        stream=request.stream,
        include_usage=bool(request.stream_options and request.stream_options.include_usage),
        constraint_field=field,
        tools=tools.plan,
        thinking=thinking,
    )
