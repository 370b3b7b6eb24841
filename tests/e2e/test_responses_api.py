"""OpenAI's Responses API through the official `openai` client, against a real server.

Every Responses request is a chat request in other words, so each answer here is
checked against the chat endpoint's answer to the same conversation: same text (greedy),
same prompt token count, and a ledger entry like any other request.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import openai
import pytest
from hydrant_server import RunningServer
from pydantic import BaseModel, Field

pytestmark = pytest.mark.slow


def test_text_answer_equals_the_chat_answer(server: RunningServer, client: openai.OpenAI) -> None:
    raw = client.responses.with_raw_response.create(
        model="demo",
        instructions="Be brief.",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Rivers?"}]}],
        max_output_tokens=12,
        temperature=0,
        metadata={"ticket": "42"},
    )
    response = raw.parse()
    chat = client.chat.completions.create(
        model="demo",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Rivers?"},
        ],
        max_tokens=12,
        temperature=0,
    )
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.output_text == chat.choices[0].message.content
    assert response.usage is not None and chat.usage is not None
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens
    assert response.metadata == {"ticket": "42"} and response.instructions == "Be brief."
    if chat.choices[0].finish_reason == "length":
        assert response.status == "incomplete"
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"
    else:
        assert response.status == "completed"
    entry = server.ledger_entry(raw.headers["x-request-id"])
    assert entry is not None and entry[0] == "finished"


def test_stream_events_build_the_same_response(client: openai.OpenAI) -> None:
    request: dict[str, Any] = {
        "model": "demo",
        "input": "Write one line about rivers.",
        "max_output_tokens": 16,
        "temperature": 0,
    }
    whole = client.responses.create(**request)
    events = list(client.responses.create(stream=True, **request))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == f"response.{whole.status}"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == whole.output_text
    assert final.usage is not None and whole.usage is not None
    # (cached input differs: the second request finds the first's prefix cached)
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens == whole.usage.input_tokens
    item_events = [e for e in events if e.type.startswith("response.output_item.")]
    assert [e.type for e in item_events] == [
        "response.output_item.added",
        "response.output_item.done",
    ]


class Review(BaseModel):
    verdict: Literal["yes", "no"]
    score: int = Field(ge=0, le=9)


def test_text_format_parses_with_the_clients_helper(client: openai.OpenAI) -> None:
    parsed = client.responses.parse(
        model="demo", input="Review rivers.", text_format=Review, max_output_tokens=40
    )
    assert parsed.status == "completed"
    assert isinstance(parsed.output_parsed, Review)
    # The client's streaming helper accumulates our events into the same kind of answer.
    with client.responses.stream(
        model="demo", input="Review rivers.", text_format=Review, max_output_tokens=40
    ) as stream:
        final = stream.get_final_response()
    assert isinstance(final.output_parsed, Review)


WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


# One token per character of the call's frame plus twelve per city character (an
# escaped surrogate pair such as \ud83d\ude00): no draw can run out before the call
# closes, so `incomplete` here is a bug, not bad luck.
MAX_CALL_TOKENS = len('[{"name":"get_weather","parameters":{"city":""}}]') + 12 * 8


def test_function_calls_and_their_outputs_round_trip(client: openai.OpenAI) -> None:
    called = client.responses.create(
        model="demo",
        input="Weather in Oslo?",
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=MAX_CALL_TOKENS,
        temperature=0,
    )
    (call,) = [item for item in called.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.status == "completed"
    assert isinstance(json.loads(call.arguments)["city"], str)
    named = client.responses.create(
        model="demo",
        input="Weather?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=MAX_CALL_TOKENS,
        temperature=0,
    )
    assert named.status == "completed"
    assert [item.type for item in named.output] == ["function_call"]
    # The client sends back the call and its output; the model answers in text.
    answered = client.responses.create(
        model="demo",
        input=[
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "4 degrees"},
        ],
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=4,
    )
    chat = client.chat.completions.create(
        model="demo",
        messages=[
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call.call_id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call.call_id, "content": "4 degrees"},
        ],
        tools=[{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}],
        tool_choice="none",
        max_tokens=4,
    )
    assert answered.usage is not None and chat.usage is not None
    assert answered.usage.input_tokens == chat.usage.prompt_tokens
    assert [item.type for item in answered.output] == ["message"]


def test_what_the_server_refuses(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model="demo", input="x", previous_response_id="resp_1")
    assert missing.value.param == "previous_response_id"
    for request, param in [
        ({"input": "x", "conversation": "conv_1"}, "conversation"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
        ({"input": [{"type": "image_generation_call"}]}, "input"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "text": {"format": {"type": "yaml"}}}, "response_format"),
    ]:
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model="demo", **request)
        assert refused.value.param == param, request


def test_answers_are_stored_listed_and_deleted(client: openai.OpenAI) -> None:
    created = client.responses.create(
        model="demo", input="Rivers?", instructions="Brief.", max_output_tokens=6, temperature=0
    )
    assert created.store is True
    kept = client.responses.retrieve(created.id)
    assert (kept.id, kept.output_text, kept.usage) == (
        created.id,
        created.output_text,
        created.usage,
    )
    listed = client.responses.input_items.list(created.id)
    assert [(i.type, i.role) for i in listed.data] == [("message", "user")]  # type: ignore[union-attr]
    assert listed.data[0].content[0].text == "Rivers?"  # type: ignore[union-attr]
    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(created.id)
    # Not kept when asked so: retrieving it is a 404.
    unkept = client.responses.create(model="demo", input="x", max_output_tokens=2, store=False)
    assert unkept.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unkept.id)


def test_a_follow_up_continues_the_stored_conversation(client: openai.OpenAI) -> None:
    """`previous_response_id` puts the chain's turns before the new input: the prompt is
    the chat conversation of all of them (the same token count, the same greedy answer)."""
    greedy: dict[str, Any] = {"model": "demo", "max_output_tokens": 6, "temperature": 0}
    first = client.responses.create(input="Rivers?", **greedy)
    second = client.responses.create(input="And lakes?", previous_response_id=first.id, **greedy)
    third = client.responses.create(input="Seas?", previous_response_id=second.id, **greedy)
    conversation = [
        {"role": "user", "content": "Rivers?"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And lakes?"},
        {"role": "assistant", "content": second.output_text},
        {"role": "user", "content": "Seas?"},
    ]
    chat = client.chat.completions.create(
        model="demo",
        messages=conversation,
        max_tokens=6,
        temperature=0,  # type: ignore[arg-type]
    )
    assert third.usage is not None and chat.usage is not None
    assert third.usage.input_tokens == chat.usage.prompt_tokens
    assert third.output_text == chat.choices[0].message.content
    items = client.responses.input_items.list(third.id, order="asc", limit=100).data
    assert [getattr(i, "role", None) for i in items] == ["user", "assistant"] * 2 + ["user"]
    page = client.responses.input_items.list(third.id, limit=2)  # newest first
    assert page.has_more and [getattr(i, "role", None) for i in page.data] == ["user", "assistant"]


def test_a_streamed_answer_is_stored_before_it_completes(client: openai.OpenAI) -> None:
    events = list(
        client.responses.create(
            model="demo", input="Rivers?", max_output_tokens=4, temperature=0, stream=True
        )
    )
    final = events[-1].response  # type: ignore[union-attr]
    assert final.store is True
    assert client.responses.retrieve(final.id).output_text == final.output_text


def test_another_tenants_answers_do_not_exist(server: RunningServer, client: openai.OpenAI) -> None:
    mine = client.responses.create(model="demo", input="Rivers?", max_output_tokens=2)
    _, secret = server.tenant_key("someone-else")
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=secret, max_retries=0) as other:
        with pytest.raises(openai.NotFoundError):
            other.responses.retrieve(mine.id)
        with pytest.raises(openai.NotFoundError):
            other.responses.delete(mine.id)
        with pytest.raises(openai.NotFoundError) as refused:
            other.responses.create(model="demo", input="x", previous_response_id=mine.id)
    assert refused.value.param == "previous_response_id"
    assert client.responses.retrieve(mine.id).id == mine.id  # still there for its tenant
