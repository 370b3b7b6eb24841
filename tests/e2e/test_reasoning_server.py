"""A thinking model's reasoning returned apart from its answer (`reasoning_content`),
against a real `hydrant serve` and the `openai` client.

The checkpoint is the demo model with a Qwen 3-style template: the generation prompt
opens `<think>`, unless `chat_template_kwargs` says `enable_thinking: false` (then it
writes an empty, closed one). The demo's random weights never close the tag, so
what it writes is all reasoning, and must equal what `/v1/completions` writes for the
same prompt tokens; with thinking off, it is all answer. A second copy has `</think>`
as one token of its vocabulary, as Qwen 3 and DeepSeek-R1 have it, so a constrained
answer can wait for the thinking to end.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import openai
import pytest
import torch
from hydrant_server import tenant_client, with_chat_template
from pydantic import BaseModel, Field
from safetensors.torch import load_file, save_file

from hydrant.engine.tokenizer import Tokenizer

pytestmark = pytest.mark.slow

THINKING_TEMPLATE = (
    "{% for message in messages %}<|start_header_id|>{{ message.role }}<|end_header_id|>"
    "\n\n{{ message.content }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\n\n</think>\n\n' }}{% else %}{{ '<think>\n' }}{% endif %}{% endif %}"
)
MESSAGES: Any = [{"role": "user", "content": "Is 7 prime?"}]


@pytest.fixture(scope="module")
def thinking_model_dir(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("thinking") / "model"
    return with_chat_template(demo_model_dir, target, THINKING_TEMPLATE)


@pytest.fixture(scope="module")
def client(thinking_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with tenant_client(tmp_path_factory.mktemp("serve"), thinking_model_dir, "thinker") as client:
        yield client


def _completion_of(client: openai.OpenAI, prompt: list[int]) -> str:
    done = client.completions.create(model="demo", prompt=prompt, max_tokens=12, temperature=0)
    return done.choices[0].text


def test_thinking_is_reasoning_content_whole_and_streamed(
    client: openai.OpenAI, thinking_model_dir: Path
) -> None:
    tokenizer = Tokenizer.from_pretrained(thinking_model_dir)
    prompt = tokenizer.encode_chat(MESSAGES)
    assert tokenizer.decode(prompt).endswith("<think>\n")
    written = _completion_of(client, prompt)
    assert written and "</think>" not in written
    request: dict[str, Any] = {
        "model": "demo",
        "messages": MESSAGES,
        "max_tokens": 12,
        "temperature": 0,
    }
    completion = client.chat.completions.create(**request)
    message = completion.choices[0].message
    assert message.content is None
    assert message.model_extra is not None
    assert message.model_extra["reasoning_content"] == written
    # Cut short while thinking: every output token was thinking.
    assert completion.usage is not None and completion.usage.completion_tokens == 12
    assert completion.usage.completion_tokens_details is not None
    assert completion.usage.completion_tokens_details.reasoning_tokens == 12
    reasoning, content = "", ""
    streamed = client.chat.completions.create(
        stream=True, stream_options={"include_usage": True}, **request
    )
    for chunk in streamed:
        for c in chunk.choices:
            extra = c.delta.model_extra or {}
            reasoning += extra.get("reasoning_content") or ""
            content += c.delta.content or ""
        if chunk.usage is not None:
            assert chunk.usage.completion_tokens_details is not None
            assert chunk.usage.completion_tokens_details.reasoning_tokens == 12
    assert (reasoning, content) == (written, "")
    response = client.responses.create(
        model="demo", input="Is 7 prime?", max_output_tokens=12, temperature=0, store=False
    )
    assert response.usage is not None and response.usage.output_tokens == 12
    assert response.usage.output_tokens_details.reasoning_tokens == 12


def test_thinking_off_through_chat_template_kwargs(
    client: openai.OpenAI, thinking_model_dir: Path
) -> None:
    tokenizer = Tokenizer.from_pretrained(thinking_model_dir)
    text, prompt = tokenizer.render_chat(MESSAGES, extra_context={"enable_thinking": False})
    assert text.endswith("<think>\n\n</think>\n\n")
    written = _completion_of(client, prompt)
    completion = client.chat.completions.create(
        model="demo",
        messages=MESSAGES,
        max_tokens=12,
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert completion.usage is not None and completion.usage.prompt_tokens == len(prompt)
    message = completion.choices[0].message
    assert message.content == written
    assert (message.model_extra or {}).get("reasoning_content") is None
    assert completion.usage.completion_tokens_details is not None
    assert completion.usage.completion_tokens_details.reasoning_tokens == 0


class Verdict(BaseModel):
    verdict: Literal["yes", "no"]
    score: int = Field(ge=0, le=9)


def _greedy_ids(model_dir: Path, prompt: list[int], count: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=count)
    return [int(t) for t in out[0, len(prompt) :]]


def _with_think_token(model_dir: Path, target: Path) -> Path:
    """A copy whose vocabulary gains `</think>` as one added (not special) token, id 2048,
    whose weights are those of a token X the model writes greedily a few tokens into its
    answer: with a tiny bias, the model then closes its thinking exactly where it would
    first write X, and goes on as if it had."""
    with_chat_template(model_dir, target, THINKING_TEMPLATE)
    prompt = Tokenizer.from_pretrained(target).encode_chat(MESSAGES)
    free = _greedy_ids(model_dir, prompt, 12)
    twin = next(free[i] for i in range(3, len(free)) if free[i] not in free[:i])
    weights = load_file(target / "model.safetensors")
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        weights[name] = torch.cat([weights[name], weights[name][twin : twin + 1]])
    save_file(weights, target / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((target / "config.json").read_text("utf-8"))
    config["vocab_size"] += 1
    (target / "config.json").write_text(json.dumps(config), "utf-8")
    tokenizer_file = target / "tokenizer.json"
    spec = json.loads(tokenizer_file.read_text("utf-8"))
    spec["added_tokens"].append(
        {
            "id": config["vocab_size"] - 1,
            "content": "</think>",
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": False,
        }
    )
    tokenizer_file.write_text(json.dumps(spec), "utf-8")
    return target


@pytest.fixture(scope="module")
def think_token_client(
    demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, int, Path]]:
    model_dir = _with_think_token(demo_model_dir, tmp_path_factory.mktemp("think") / "model")
    close = Tokenizer.from_pretrained(model_dir).encode("</think>", add_special_tokens=False)
    assert len(close) == 1
    with tenant_client(tmp_path_factory.mktemp("serve"), model_dir, "thinker2") as client:
        yield client, close[0], model_dir


def test_a_constrained_answer_comes_after_the_thinking(
    think_token_client: tuple[openai.OpenAI, int, Path],
) -> None:
    client, close, model_dir = think_token_client
    request: dict[str, Any] = {
        "model": "demo",
        "messages": MESSAGES,
        "max_tokens": 60,
        "temperature": 0,
        "logit_bias": {str(close): 0.001},  # wins its tie with its twin
    }
    answered = client.chat.completions.create(**request)
    free = answered.choices[0].message
    free_reasoning = (free.model_extra or {}).get("reasoning_content")
    assert free_reasoning and free.content is not None  # it thought a while, then answered
    # Its reasoning tokens are those the engine writes before its text holds `</think>`.
    assert answered.usage is not None and answered.usage.completion_tokens_details is not None
    thought = answered.usage.completion_tokens_details.reasoning_tokens
    assert 0 < thought < answered.usage.completion_tokens
    prompt = Tokenizer.from_pretrained(model_dir).encode_chat(MESSAGES)
    for count, closed in ((thought, True), (thought - 1, False)):
        written = client.completions.create(
            model="demo",
            prompt=prompt,
            max_tokens=count,
            temperature=0,
            logit_bias={str(close): 0.001},
        )
        assert ("</think>" in written.choices[0].text) is closed
    body = {**Verdict.model_json_schema(), "additionalProperties": False}
    schema = {"name": "verdict", "schema": body, "strict": True}
    request["response_format"] = {"type": "json_schema", "json_schema": schema}
    choice = client.chat.completions.create(**request).choices[0]
    # Free while thinking (the same greedy reasoning as unconstrained), held to the form after.
    assert (choice.message.model_extra or {}).get("reasoning_content") == free_reasoning
    assert choice.message.content is not None and choice.finish_reason == "stop"
    Verdict.model_validate_json(choice.message.content)
    reasoning, content = "", ""
    for chunk in client.chat.completions.create(stream=True, **request):
        for c in chunk.choices:
            reasoning += (c.delta.model_extra or {}).get("reasoning_content") or ""
            content += c.delta.content or ""
    assert (reasoning, content) == (free_reasoning, choice.message.content)
    # The client's own helper parses the answer of a thinking model too.
    parsed = client.chat.completions.parse(
        **{k: v for k, v in request.items() if k != "response_format"}, response_format=Verdict
    )
    assert isinstance(parsed.choices[0].message.parsed, Verdict)


def test_without_a_think_token_the_form_holds_from_the_first_token(
    client: openai.OpenAI,
) -> None:
    """The demo vocabulary spells `</think>` in pieces, which the engine cannot wait for:
    the answer is the form at once, none of it reasoning."""
    completion = client.chat.completions.parse(
        model="demo", messages=MESSAGES, max_tokens=40, temperature=0, response_format=Verdict
    )
    message = completion.choices[0].message
    assert isinstance(message.parsed, Verdict)
    assert (message.model_extra or {}).get("reasoning_content") is None
