"""`tool_choice` auto on a model whose chat template teaches Hermes `<tool_call>` tags
(as Qwen 2.5/3 and Hermes 3 do), against a real `hydrant serve` and the `openai` client.

The checkpoint is the demo model with a Hermes-style template: its weights are random,
so the answer's form is forced with a regex (vLLM's `structured_outputs`), and the
gateway reads content and calls from the text as it would from a trained model's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from hydrant_server import tenant_client, with_chat_template

from hydrant.engine.tokenizer import Tokenizer

pytestmark = pytest.mark.slow

HERMES_TEMPLATE = (
    "{% if tools %}<|start_header_id|>system<|end_header_id|>\n\n# Tools\n\nYou may call one"
    " or more functions to assist with the user query.\n\nYou are provided with function"
    " signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n\nFor each function"
    " call, return a json object with function name and arguments within"
    ' <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments":'
    " <args-json-object>}\n</tool_call><|eot_id|>{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'assistant' and message.tool_calls is defined %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{{ message.content or '' }}"
    "{% for call in message.tool_calls %}\n<tool_call>\n"
    '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}'
    "\n</tool_call>{% endfor %}<|eot_id|>"
    "{% elif message.role == 'tool' %}"
    "<|start_header_id|>user<|end_header_id|>\n\n<tool_response>\n{{ message.content }}"
    "\n</tool_response><|eot_id|>"
    "{% else %}"
    "<|start_header_id|>{{ message.role }}<|end_header_id|>\n\n{{ message.content }}<|eot_id|>"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ANSWER = (
    r'Let me check\.\n<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "[a-z]{1,6}"\}\}'
    r"\n</tool_call>\n<tool_call>\n\{\"name\": \"get_weather\", \"arguments\": "
    r'\{"city": "[a-z]{1,6}"\}\}\n</tool_call>'
)


@pytest.fixture(scope="module")
def hermes_model_dir(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("hermes") / "model"
    return with_chat_template(demo_model_dir, target, HERMES_TEMPLATE)


@pytest.fixture(scope="module")
def client(hermes_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with tenant_client(tmp_path_factory.mktemp("serve"), hermes_model_dir, "hermes") as client:
        yield client


def test_auto_reads_hermes_calls_and_the_text_before_them(
    client: openai.OpenAI, hermes_model_dir: Path
) -> None:
    messages: Any = [{"role": "user", "content": "Weather in two cities?"}]
    request: dict[str, Any] = {
        "model": "demo",
        "messages": messages,
        "tools": [WEATHER],
        "max_tokens": 240,
        "temperature": 0,
        "extra_body": {"structured_outputs": {"regex": ANSWER}},
    }
    completion = client.chat.completions.create(**request)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    calls = choice.message.tool_calls or []
    assert len(calls) == 2 and len({c.id for c in calls}) == 2
    for call in calls:
        assert call.function.name == "get_weather"
        assert re.fullmatch("[a-z]{1,6}", json.loads(call.function.arguments)["city"])
    # The template showed the model its tools, in Hermes' words.
    tokenizer = Tokenizer.from_pretrained(hermes_model_dir)
    prompt = tokenizer.encode_chat(messages, tools=[WEATHER])
    assert completion.usage is not None and completion.usage.prompt_tokens == len(prompt)
    assert json.dumps(WEATHER) in tokenizer.decode(prompt)

    content, streamed, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **request):
        for c in chunk.choices:
            content += c.delta.content or ""
            for piece in c.delta.tool_calls or []:
                assert piece.id is not None and piece.function is not None  # whole calls
                streamed[piece.index] = (piece.function.name, piece.function.arguments)
            finish = c.finish_reason or finish
    assert (content, finish) == ("Let me check.", "tool_calls")
    assert [streamed[i] for i in sorted(streamed)] == [
        (c.function.name, c.function.arguments) for c in calls
    ]


def test_a_hermes_conversation_round_trips_the_call(
    client: openai.OpenAI, hermes_model_dir: Path
) -> None:
    """The client sends back the call it got and the tool's answer: the template writes
    the call as the model would have (arguments as an object) and the answer in
    `<tool_response>` tags; with tool_choice none the model answers in text."""
    call = {
        "id": "call_abc",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "oslo"}'},
    }
    messages: Any = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "4 degrees"},
    ]
    completion = client.chat.completions.create(
        model="demo", messages=messages, tools=[WEATHER], tool_choice="none", max_tokens=5
    )
    choice = completion.choices[0]
    assert choice.message.tool_calls is None and choice.message.content is not None
    tokenizer = Tokenizer.from_pretrained(hermes_model_dir)
    as_template = [
        messages[0],
        {
            **messages[1],
            "tool_calls": [
                {**call, "function": {"name": "get_weather", "arguments": {"city": "oslo"}}}
            ],
        },
        messages[2],
    ]
    prompt = tokenizer.encode_chat(as_template, tools=[WEATHER])
    assert completion.usage is not None and completion.usage.prompt_tokens == len(prompt)
    text = tokenizer.decode(prompt)
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "oslo"}}\n</tool_call>' in text
    )
    assert "<tool_response>\n4 degrees\n</tool_response>" in text
