"""The official `openai` client against a real `hydrant serve` process.

Usage reported to the client must equal what the ledger recorded, and the
prompt token count must equal what the model's own tokenizer gives.
"""

from __future__ import annotations

import re
import time
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

import httpx
import openai
import pytest
from hydrant_server import RunningServer
from pydantic import BaseModel, Field

from hydrant.engine.tokenizer import Tokenizer

pytestmark = pytest.mark.slow


MESSAGES = [{"role": "user", "content": "Write one line about rivers."}]


def test_chat_completion_usage_matches_tokenizer_and_ledger(
    server: RunningServer, client: openai.OpenAI, demo_model_dir: Path
) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="demo",
        messages=MESSAGES,
        max_tokens=12,
        temperature=0,  # type: ignore[arg-type]
    )
    request_id = raw.headers["x-request-id"]
    completion = raw.parse()
    assert completion.object == "chat.completion"
    assert completion.id == f"chatcmpl-{request_id}"
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason in {"stop", "length"}
    usage = completion.usage
    assert usage is not None
    expected_prompt = len(Tokenizer.from_pretrained(demo_model_dir).encode_chat(MESSAGES))
    assert usage.prompt_tokens == expected_prompt
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    if choice.finish_reason == "length":
        assert usage.completion_tokens == 12
    entry = server.ledger_entry(request_id)
    assert entry is not None
    status, input_tokens, cached, output_tokens, charged = entry
    assert (status, input_tokens, output_tokens) == (
        "finished",
        usage.prompt_tokens,
        usage.completion_tokens,
    )
    assert cached == usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    # default price book: 0.10 / 0.05 (cached) / 0.40 per million tokens
    expected = (
        Decimal(input_tokens - cached) * Decimal("0.10")  # type: ignore[operator]
        + Decimal(cached) * Decimal("0.05")  # type: ignore[arg-type]
        + Decimal(output_tokens) * Decimal("0.40")  # type: ignore[arg-type]
    ) / Decimal(1_000_000)
    assert Decimal(str(charged)) == expected.quantize(Decimal("0.000001"))


def test_greedy_is_deterministic(client: openai.OpenAI) -> None:
    texts = {
        client.chat.completions.create(
            model="demo",
            messages=MESSAGES,
            max_tokens=8,
            temperature=0,  # type: ignore[arg-type]
        )
        .choices[0]
        .message.content
        for _ in range(2)
    }
    assert len(texts) == 1


def test_streaming_chat_with_usage(server: RunningServer, client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="demo",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=10,
        stream=True,
        stream_options={"include_usage": True},
        seed=7,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish and finish[-1] in {"stop", "length"}
    usage = chunks[-1].usage
    assert usage is not None and chunks[-1].choices == []
    assert usage.completion_tokens >= 1
    same = client.chat.completions.create(
        model="demo",
        messages=MESSAGES,
        max_tokens=10,
        seed=7,  # type: ignore[arg-type]
    )
    assert same.choices[0].message.content == text  # same seed, streamed or not


def test_completions_and_n(client: openai.OpenAI) -> None:
    completion = client.completions.create(
        model="demo",
        prompt="Once upon a time",
        max_tokens=6,
        n=2,
        temperature=1.0,
        seed=3,
        logprobs=2,
    )
    assert completion.object == "text_completion"
    assert [c.index for c in completion.choices] == [0, 1]
    usage = completion.usage
    assert usage is not None
    assert usage.completion_tokens == sum(
        len(c.logprobs.tokens)
        for c in completion.choices  # type: ignore[union-attr]
    )
    for choice in completion.choices:
        assert choice.logprobs is not None
        assert all(lp <= 0 for lp in choice.logprobs.token_logprobs)
        assert all(len(top) <= 2 for top in choice.logprobs.top_logprobs)


def test_logprob_bytes_rebuild_the_text_where_tokens_split_characters(
    client: openai.OpenAI,
) -> None:
    """Each logprob's `bytes` are its token's own, so joining them rebuilds the content even
    where a character spans tokens (the demo model samples such pieces often): a piece's
    `token` text is U+FFFD, its bytes are not EF BF BD."""
    pieces = 0
    for seed in range(6):
        for stream in (False, True):
            kwargs = dict(
                model="demo",
                messages=[{"role": "user", "content": "写一句关于河流的话 🙂"}],
                max_tokens=16,
                temperature=1.0,
                seed=seed,
                logprobs=True,
                top_logprobs=3,
            )
            if stream:
                chunks = list(client.chat.completions.create(stream=True, **kwargs))  # type: ignore[call-overload]
                content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                entries = [
                    e
                    for c in chunks
                    if c.choices and c.choices[0].logprobs
                    for e in c.choices[0].logprobs.content or []
                ]
            else:
                reply = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
                content = reply.choices[0].message.content or ""
                assert reply.choices[0].logprobs is not None
                entries = list(reply.choices[0].logprobs.content or [])
            joined = b"".join(bytes(e.bytes or []) for e in entries)
            assert joined.decode("utf-8", errors="replace") == content
            for entry in entries:
                raw = bytes(entry.bytes or [])
                assert entry.token == raw.decode("utf-8", errors="replace")
                for top in entry.top_logprobs:
                    assert top.token == bytes(top.bytes or []).decode("utf-8", errors="replace")
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError:
                    pieces += 1
    assert pieces, "no sampled token was a piece of a character: the case went untested"


def test_echo_with_logprobs_scores_the_prompt_as_transformers_does(
    client: openai.OpenAI, demo_model_dir: Path
) -> None:
    """Legacy completions with `echo` and `logprobs` (how evaluation harnesses score text):
    the prompt's tokens lead the logprobs, the first without a score, each scored by the
    model given the tokens before it; streamed, the echo event carries the same scores."""
    import torch
    from transformers import AutoModelForCausalLM

    prompt = "The river runs to the sea, 河流 🌊"
    kwargs = dict(model="demo", prompt=prompt, max_tokens=1, echo=True, logprobs=2, temperature=0.0)
    completion = client.completions.create(**kwargs)  # type: ignore[call-overload]
    choice = completion.choices[0]
    logprobs = choice.logprobs
    assert logprobs is not None and completion.usage is not None
    ids = Tokenizer.from_pretrained(demo_model_dir).encode(prompt)
    assert completion.usage.prompt_tokens == len(ids)
    assert len(logprobs.tokens) == len(ids) + 1  # the prompt, then the one generated token
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert choice.text.startswith(prompt)
    offsets = logprobs.text_offset
    assert offsets[0] == 0 and offsets == sorted(offsets) and offsets[-1] == len(prompt)

    model = AutoModelForCausalLM.from_pretrained(demo_model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        expected = model(torch.tensor([ids])).logits[0].float().log_softmax(dim=-1)
    for i in range(1, len(ids)):
        assert logprobs.token_logprobs[i] == pytest.approx(float(expected[i - 1, ids[i]]), abs=1e-3)
        top = logprobs.top_logprobs[i]
        assert top is not None and len(top) == 2
        assert max(top.values()) == pytest.approx(float(expected[i - 1].max()), abs=1e-3)

    events = list(client.completions.create(stream=True, **kwargs))  # type: ignore[call-overload]
    echoed = events[0].choices[0]
    assert echoed.text == choice.text[: len(echoed.text)] and echoed.text.startswith(prompt)
    assert echoed.logprobs is not None
    assert echoed.logprobs.token_logprobs == logprobs.token_logprobs[: len(ids)]
    assert echoed.logprobs.text_offset == offsets[: len(ids)]

    # max_tokens 0: the scores alone, no token generated or billed
    scored = client.completions.create(**{**kwargs, "max_tokens": 0})  # type: ignore[call-overload]
    assert scored.usage is not None and scored.usage.completion_tokens == 0
    assert scored.choices[0].text == prompt and scored.choices[0].finish_reason == "length"
    assert scored.choices[0].logprobs.token_logprobs == logprobs.token_logprobs[: len(ids)]
    with pytest.raises(openai.BadRequestError) as refused:  # without echo there is nothing to do
        client.completions.create(model="demo", prompt=prompt, max_tokens=0, logprobs=1)
    assert refused.value.body["param"] == "max_tokens"  # type: ignore[index]


def test_streamed_text_offsets_equal_the_whole_responses(client: openai.OpenAI) -> None:
    """A stop string makes the stream hold back text that may still become it; the offsets
    of later tokens count the whole text all the same, as unstreamed."""
    for echo in (False, True):
        kwargs = dict(
            model="demo",
            prompt="Once upon a time",
            max_tokens=24,
            temperature=0.0,
            logprobs=1,
            echo=echo,
            stop=["ve xyz"],  # the demo model says " save": "ve" is held back each time
        )
        whole = client.completions.create(**kwargs)  # type: ignore[call-overload]
        assert whole.choices[0].logprobs is not None
        events = list(client.completions.create(stream=True, **kwargs))  # type: ignore[call-overload]
        streamed = [
            offset
            for event in events
            for choice in event.choices
            if choice.logprobs
            for offset in choice.logprobs.text_offset
        ]
        assert streamed == whole.choices[0].logprobs.text_offset
        if not echo:  # some chunk's text was short of its tokens': the case was exercised
            held = [
                c
                for e in events
                for c in e.choices
                if c.logprobs and c.text != "".join(c.logprobs.tokens)
            ]
            assert held, "no text was held back"
        assert "".join(c.text for e in events for c in e.choices) == whole.choices[0].text


BATCH = ["Once upon a time", "The river runs to the sea", "河流说 🌊"]


def test_batched_prompts_answer_as_each_prompt_alone(
    server: RunningServer, client: openai.OpenAI, demo_model_dir: Path
) -> None:
    """A `prompt` list is a batch: choice `i` of prompt `p` is choice `p * n + i`, each as
    the prompt alone would get it; usage and the one ledger entry sum the prompts."""
    kwargs = dict(model="demo", max_tokens=8, n=2, temperature=0.0, logprobs=1)
    alone = [client.completions.create(prompt=p, **kwargs) for p in BATCH]  # type: ignore[call-overload]
    raw = client.completions.with_raw_response.create(prompt=BATCH, **kwargs)  # type: ignore[call-overload]
    batch = raw.parse()
    assert [c.index for c in batch.choices] == list(range(6))
    for index, choice in enumerate(batch.choices):
        expected = alone[index // 2].choices[index % 2]
        assert choice.text == expected.text
        assert choice.logprobs.tokens == expected.logprobs.tokens  # type: ignore[union-attr]
        assert choice.logprobs.token_logprobs == pytest.approx(  # type: ignore[union-attr]
            expected.logprobs.token_logprobs,  # type: ignore[union-attr]
            abs=1e-3,
        )
        assert choice.logprobs.text_offset == expected.logprobs.text_offset  # type: ignore[union-attr]
    usage = batch.usage
    assert usage is not None
    tokenizer = Tokenizer.from_pretrained(demo_model_dir)
    assert usage.prompt_tokens == sum(len(tokenizer.encode(p)) for p in BATCH)
    assert usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)  # type: ignore[union-attr]
    entry = server.ledger_entry(raw.headers["x-request-id"])
    assert entry is not None
    status, input_tokens, _, output_tokens, _ = entry
    assert (status, input_tokens, output_tokens) == (
        "finished",
        usage.prompt_tokens,
        usage.completion_tokens,
    )
    assert server.ledger_entry(raw.headers["x-request-id"] + "-0") is None  # one entry, not three

    # the same batch as token ids, streamed: every choice's text arrives under its index
    ids = [tokenizer.encode(p) for p in BATCH]
    events = list(
        client.completions.create(
            prompt=ids,
            stream=True,
            stream_options={"include_usage": True},
            **kwargs,  # type: ignore[arg-type]
        )
    )
    texts = [""] * 6
    for event in events:
        for choice in event.choices:
            texts[choice.index] += choice.text
    assert texts == [c.text for c in batch.choices]
    assert events[-1].usage is not None
    assert events[-1].usage.completion_tokens == usage.completion_tokens


def test_batched_echo_scores_each_prompt(client: openai.OpenAI) -> None:
    """How lm-evaluation-harness scores at a batch size above 1: echo, logprobs and
    max_tokens 0 over a list of prompts, each scored as alone."""
    kwargs = dict(model="demo", max_tokens=0, echo=True, logprobs=1, temperature=0.0)
    alone = [client.completions.create(prompt=p, **kwargs) for p in BATCH]  # type: ignore[call-overload]
    batch = client.completions.create(prompt=BATCH, **kwargs)  # type: ignore[call-overload]
    assert [c.text for c in batch.choices] == BATCH
    for choice, single in zip(batch.choices, alone, strict=True):
        assert choice.logprobs is not None and single.choices[0].logprobs is not None
        assert choice.logprobs.tokens == single.choices[0].logprobs.tokens
        assert choice.logprobs.token_logprobs[0] is None
        assert choice.logprobs.token_logprobs[1:] == pytest.approx(
            single.choices[0].logprobs.token_logprobs[1:], abs=1e-3
        )
    events = list(client.completions.create(prompt=BATCH, stream=True, **kwargs))  # type: ignore[call-overload]
    echoed: dict[int, Any] = {}  # each choice's first event: the echo
    for event in events:
        for choice in event.choices:
            echoed.setdefault(choice.index, choice)
    assert sorted(echoed) == [0, 1, 2]
    for index, choice in echoed.items():
        assert choice.text == BATCH[index]
        assert choice.logprobs.tokens == batch.choices[index].logprobs.tokens  # type: ignore[union-attr]


def test_models_list_and_retrieve(client: openai.OpenAI) -> None:
    listed = list(client.models.list())
    assert [m.id for m in listed] == ["demo"]
    model = client.models.retrieve("demo")
    assert (model.id, model.created, model.object) == ("demo", listed[0].created, "model")
    for missing in ("nope", "org/nope"):  # served names may hold a slash
        with pytest.raises(openai.NotFoundError) as info:
            client.models.retrieve(missing)
        assert info.value.code == "model_not_found"


def _token_id(tokenizer: Tokenizer, raw: list[int] | None) -> int:
    """The vocabulary id whose bytes a logprob entry reports."""
    assert raw is not None
    ids = [i for i in range(tokenizer.vocab_size) if tokenizer.token_bytes(i) == bytes(raw)]
    assert len(ids) == 1, (raw, ids)
    return ids[0]


def test_logit_bias_bans_the_top_token_and_forces_another(
    client: openai.OpenAI, demo_model_dir: Path
) -> None:
    tokenizer = Tokenizer.from_pretrained(demo_model_dir)
    greedy: dict[str, Any] = {"model": "demo", "messages": MESSAGES, "temperature": 0}
    plain = client.chat.completions.create(**greedy, max_tokens=1, logprobs=True, top_logprobs=2)
    first = plain.choices[0].logprobs.content[0]  # type: ignore[union-attr,index]
    top, runner_up = first.top_logprobs
    assert _token_id(tokenizer, top.bytes) == _token_id(tokenizer, first.bytes)
    banned_id = _token_id(tokenizer, top.bytes)
    # Banned, the argmax gives way to the runner-up: the bias reached the sampler, on the
    # right token id, and nothing else moved.
    banned = client.chat.completions.create(
        **greedy, max_tokens=1, logprobs=True, logit_bias={str(banned_id): -100}
    )
    now = banned.choices[0].logprobs.content[0]  # type: ignore[union-attr,index]
    assert now.bytes == runner_up.bytes and now.bytes != top.bytes
    # Forced (+100), one token wins every step, streamed or not, on both endpoints.
    (forced_id,) = tokenizer.encode("b", add_special_tokens=False)
    forced = client.chat.completions.create(
        **greedy, max_tokens=5, logit_bias={str(forced_id): 100}
    )
    text = tokenizer.decode([forced_id] * 5)
    assert text == "bbbbb"
    assert forced.choices[0].message.content == text
    assert forced.usage is not None and forced.usage.completion_tokens == 5
    stream = client.chat.completions.create(
        **greedy, max_tokens=5, logit_bias={str(forced_id): 100}, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text
    completion = client.completions.create(
        model="demo", prompt="rivers", max_tokens=5, temperature=0, logit_bias={str(forced_id): 100}
    )
    assert completion.choices[0].text == text


class Review(BaseModel):
    """The client's own structured-output type: `parse` sends it as a strict json_schema."""

    verdict: Literal["yes", "no", "maybe"]
    score: int = Field(ge=0, le=9)
    tags: list[Literal["calm", "fast"]] = Field(max_length=2)


def test_structured_output_parses_with_the_clients_own_helper(
    server: RunningServer, client: openai.OpenAI, demo_model_dir: Path
) -> None:
    raw = client.chat.completions.with_raw_response.parse(
        model="demo", messages=MESSAGES, response_format=Review, max_tokens=60, n=3, seed=1
    )
    completion = raw.parse()
    assert len(completion.choices) == 3
    for choice in completion.choices:
        assert choice.finish_reason == "stop"
        assert isinstance(choice.message.parsed, Review)  # pydantic validated the JSON
    # Streamed, against the raw schema: every choice's text is a Review too.
    schema = {"name": "review", "schema": Review.model_json_schema(), "strict": True}
    schema["schema"]["additionalProperties"] = False
    stream = client.chat.completions.create(
        model="demo",
        messages=MESSAGES,  # type: ignore[arg-type]
        response_format={"type": "json_schema", "json_schema": schema},  # type: ignore[typeddict-item]
        max_tokens=60,
        n=2,
        temperature=1,  # type: ignore[arg-type]
        stream=True,
    )
    texts: dict[int, str] = {}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
    assert sorted(texts) == [0, 1]
    for text in texts.values():
        Review.model_validate_json(text)
    # JSON mode with a bias towards "}": the grammar still opens the object first.
    tokenizer = Tokenizer.from_pretrained(demo_model_dir)
    close = tokenizer.encode("}", add_special_tokens=False)
    assert len(close) == 1
    mode = client.chat.completions.create(
        model="demo",
        messages=MESSAGES,  # type: ignore[arg-type]
        response_format={"type": "json_object"},
        logit_bias={str(close[0]): 100},
        max_tokens=10,
    )
    assert mode.choices[0].message.content == "{}"
    assert mode.choices[0].finish_reason == "stop"
    entry = server.ledger_entry(raw.headers["x-request-id"])
    assert entry is not None and entry[0] == "finished"
    # vLLM's extension: the same on /v1/completions, every prompt of a batch constrained.
    batch = client.completions.create(
        model="demo",
        prompt=["A review:", "Another review:"],
        max_tokens=60,
        n=2,
        seed=3,
        extra_body={"response_format": {"type": "json_schema", "json_schema": schema}},
    )
    assert len(batch.choices) == 4
    for choice in batch.choices:
        assert choice.finish_reason == "stop"
        Review.model_validate_json(choice.text)
    # vLLM's structured_outputs: a choice on chat, a regex on completions.
    labels = ["positive", "negative", "mixed feelings"]
    picked = client.chat.completions.create(
        model="demo",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=len("mixed feelings"),  # room for the longest label, a character a token
        n=4,
        seed=5,
        extra_body={"structured_outputs": {"choice": labels}},
    )
    assert all(c.message.content in labels for c in picked.choices)
    dated = client.completions.create(
        model="demo",
        prompt="Today is",
        max_tokens=20,
        extra_body={"structured_outputs": {"regex": r"2026-(0[1-9]|1[0-2])-[0-3][0-9]"}},
    )
    assert re.fullmatch(r"2026-(0[1-9]|1[0-2])-[0-3][0-9]", dated.choices[0].text)


class GetWeather(BaseModel):
    """The weather in a city."""

    city: str = Field(max_length=8)
    unit: Literal["celsius", "fahrenheit"]


WEATHER_TOOL: Any = openai.pydantic_function_tool(GetWeather)
TIME_TOOL: Any = {
    "type": "function",
    "function": {"name": "get_time", "description": "The time now.", "parameters": {}},
}
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]


def test_required_tool_calls_parse_with_the_clients_own_helper(
    server: RunningServer, client: openai.OpenAI
) -> None:
    required: dict[str, Any] = {
        "model": "demo",
        "messages": ASK,
        "tools": [WEATHER_TOOL],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        # room for the longest call the schema allows, whatever the draw: one token per
        # character of the frame, twelve per city character (an escaped surrogate pair)
        "max_tokens": 80 + 12 * 8,
        "seed": 4,
    }
    raw = client.chat.completions.with_raw_response.parse(n=2, **required)
    completion = raw.parse()
    assert len(completion.choices) == 2
    for choice in completion.choices:
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        (call,) = choice.message.tool_calls or []
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name == "GetWeather"
        assert isinstance(call.function.parsed_arguments, GetWeather)  # pydantic validated
    entry = server.ledger_entry(raw.headers["x-request-id"])
    assert entry is not None and entry[0] == "finished"
    # The client's streaming helper assembles the deltas and validates the arguments too.
    with client.chat.completions.stream(**required) as stream:
        done = [e for e in stream if e.type == "tool_calls.function.arguments.done"]
        final = stream.get_final_completion()
    assert len(done) == 1 and isinstance(done[0].parsed_arguments, GetWeather)
    (streamed,) = final.choices[0].message.tool_calls or []
    assert isinstance(streamed.function.parsed_arguments, GetWeather)
    assert final.choices[0].finish_reason == "tool_calls"


def _joined_stream(client: openai.OpenAI, **request: Any) -> tuple[str | None, list[Any], str]:
    """A streamed chat choice as a client joins it: content, (id, name, arguments) per
    call, finish reason."""
    content: str | None = None
    calls: dict[int, list[str]] = {}
    finish = ""
    for chunk in client.chat.completions.create(stream=True, **request):
        for c in chunk.choices:
            if c.delta.content:
                content = (content or "") + c.delta.content
            for piece in c.delta.tool_calls or []:
                if piece.id is not None:
                    assert piece.index not in calls and piece.function is not None
                    calls[piece.index] = [piece.id, piece.function.name or "", ""]
                else:
                    assert piece.function is not None and piece.function.name is None
                calls[piece.index][2] += piece.function.arguments or ""
            finish = c.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


def test_named_tool_choice_streams_the_arguments_it_returns_whole(client: openai.OpenAI) -> None:
    request: dict[str, Any] = {
        "model": "demo",
        "messages": ASK,
        "tools": [WEATHER_TOOL, TIME_TOOL],
        "tool_choice": {"type": "function", "function": {"name": "GetWeather"}},
        "max_tokens": 60,
        "temperature": 0,
    }
    whole = client.chat.completions.create(**request).choices[0]
    assert whole.finish_reason == "stop"  # as OpenAI ends a forced function
    (call,) = whole.message.tool_calls or []
    assert call.function.name == "GetWeather"
    GetWeather.model_validate_json(call.function.arguments)
    content, calls, finish = _joined_stream(client, **request)
    assert content is None and finish == "stop"
    ((call_id, name, arguments),) = calls
    assert call_id.startswith("call_") and (name, arguments) == (
        "GetWeather",
        call.function.arguments,
    )


def test_auto_reads_the_models_own_json_calls(client: openai.OpenAI) -> None:
    """The demo model's template is Llama 3.1's JSON tool calling; its weights are random,
    so the answer's form is forced here with structured_outputs, and the calls are read
    from the text as from a trained model's."""
    shape = {
        "type": "object",
        "properties": {
            "name": {"const": "GetWeather"},
            "parameters": WEATHER_TOOL["function"]["parameters"],
        },
        "required": ["name", "parameters"],
        "additionalProperties": False,
    }
    request: dict[str, Any] = {
        "model": "demo",
        "messages": ASK,
        "tools": [WEATHER_TOOL, TIME_TOOL],
        "max_tokens": 80,
        "temperature": 0,
        "extra_body": {"structured_outputs": {"json": shape}},
    }
    choice = client.chat.completions.create(**request).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "GetWeather"
    GetWeather.model_validate_json(call.function.arguments)
    content, calls, finish = _joined_stream(client, **request)
    assert (content, finish) == (None, "tool_calls")
    assert [c[1:] for c in calls] == [["GetWeather", call.function.arguments]]
    # Unforced, the random model writes text: auto gives it back as content, streamed alike.
    free = {**request, "extra_body": {}, "max_tokens": 12}
    plain = client.chat.completions.create(**free).choices[0]
    assert not plain.message.tool_calls and plain.message.content
    assert _joined_stream(client, **free) == (plain.message.content, [], plain.finish_reason)


def test_a_tool_conversation_reaches_the_template(
    client: openai.OpenAI, demo_model_dir: Path
) -> None:
    arguments = '{"city": "Oslo", "unit": "celsius"}'
    conversation: list[Any] = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "GetWeather", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "4 degrees and rain"},
    ]
    completion = client.chat.completions.create(
        model="demo", messages=conversation, tools=[WEATHER_TOOL], tool_choice="none", max_tokens=4
    )
    tokenizer = Tokenizer.from_pretrained(demo_model_dir)
    rendered = [dict(m) for m in conversation]
    rendered[1]["tool_calls"] = [
        {
            **rendered[1]["tool_calls"][0],
            "function": {"name": "GetWeather", "arguments": {"city": "Oslo", "unit": "celsius"}},
        }
    ]
    expected = tokenizer.encode_chat(rendered, tools=[WEATHER_TOOL])
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == len(expected)
    text = tokenizer.decode(expected, skip_special_tokens=False)
    assert '{"name": "GetWeather", "parameters": {"city": "Oslo", "unit": "celsius"}}' in text
    assert "ipython<|end_header_id|>\n\n4 degrees and rain" in text
    assert completion.choices[0].message.tool_calls is None  # none: text only


def test_tokenize_counts_what_a_request_would_be_charged(
    server: RunningServer, client: openai.OpenAI, demo_model_dir: Path
) -> None:
    """vLLM's /tokenize and /detokenize: the exact prompt count a chat or completion
    request is metered with, before sending it; nothing runs on the engine or is billed."""
    _, secret = server.tenant_key("tokenize")
    auth = {"Authorization": f"Bearer {secret}"}
    chat: dict[str, Any] = {
        "model": "demo",
        "messages": ASK,
        "tools": [WEATHER_TOOL],
        "chat_template_kwargs": {"unused_name": 1},
    }
    with httpx.Client(base_url=server.base_url, headers=auth, timeout=30) as http:
        counted = http.post("/tokenize", json=chat)
        assert counted.status_code == 200, counted.text
        assert "x-request-id" in counted.headers
        sent = client.chat.completions.create(
            model="demo",
            messages=ASK,  # type: ignore[arg-type]
            tools=[WEATHER_TOOL],
            max_tokens=1,
            extra_body={"chat_template_kwargs": chat["chat_template_kwargs"]},
        )
        assert sent.usage is not None
        assert counted.json()["count"] == sent.usage.prompt_tokens == len(counted.json()["tokens"])
        assert counted.json()["max_model_len"] > sent.usage.prompt_tokens

        tokenizer = Tokenizer.from_pretrained(demo_model_dir)
        text = "Rivers run 长江 🌊"
        plain = http.post(
            "/tokenize", json={"model": "demo", "prompt": text, "return_token_strs": True}
        ).json()
        assert plain["tokens"] == tokenizer.encode(text)
        assert "".join(plain["token_strs"][1:]).startswith("Rivers run")
        bare = http.post(
            "/tokenize", json={"model": "demo", "prompt": text, "add_special_tokens": False}
        ).json()
        assert bare["tokens"] == tokenizer.encode(text, add_special_tokens=False)
        request_id = counted.headers["x-request-id"]
        back = http.post("/detokenize", json={"model": "demo", "tokens": bare["tokens"]})
        assert back.json() == {"prompt": text}

        for path, body, status, param in [
            ("/detokenize", {"model": "demo", "tokens": [10**6]}, 400, "tokens"),
            ("/detokenize", {"model": "demo", "tokens": "abc"}, 400, "tokens"),
            ("/tokenize", {"model": "nope", "prompt": "x"}, 404, "model"),
            ("/tokenize", {"model": "demo", "messages": []}, 400, "messages"),
            ("/tokenize", {"model": "demo", "messages": ASK, "tools": []}, 400, "tools"),
        ]:
            refused = http.post(path, json=body)
            assert refused.status_code == status, refused.text
            assert refused.json()["error"]["param"] == param
        assert http.post("/tokenize", content=b"{not json").status_code == 400
    assert (
        httpx.post(f"{server.base_url}/tokenize", json={"model": "demo", "prompt": "x"}).status_code
        == 401
    )
    assert server.ledger_entry(request_id) is None  # not metered


def test_errors_are_openai_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="nope", messages=MESSAGES)  # type: ignore[arg-type]
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(
            model="demo",
            messages=MESSAGES,
            max_tokens=10**6,  # type: ignore[arg-type]
        )
    assert bad.value.code == "context_length_exceeded"
    wrong = openai.OpenAI(base_url=client.base_url, api_key="hyd_live_nope", max_retries=0)
    with wrong, pytest.raises(openai.AuthenticationError):
        wrong.models.list()


def test_every_response_has_a_request_id(server: RunningServer) -> None:
    for path in ("/healthz", "/v1/models", "/no/such/route"):
        response = httpx.get(server.base_url + path)
        assert response.headers["x-request-id"].startswith("req_"), path


def test_logs_carry_ids_but_never_the_key_or_the_prompt(server: RunningServer) -> None:
    canary = "canary-prompt-zebra-quartz-7731"
    _, secret = server.tenant_key("log-audit")
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=secret, max_retries=0) as audit:
        raw = audit.chat.completions.with_raw_response.create(
            model="demo", messages=[{"role": "user", "content": canary}], max_tokens=3
        )
    request_id = raw.headers["x-request-id"]
    # Another last character (a key may end with "x" itself: then "x" would be the key).
    wrong_key = secret[:-1] + ("y" if secret.endswith("x") else "x")
    wrong = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=wrong_key, max_retries=0)
    with wrong, pytest.raises(openai.AuthenticationError):  # logged by nobody either
        wrong.models.list()
    deadline = time.monotonic() + 5
    while request_id not in server.log_file.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    text = server.log_file.read_text()
    line = next(line for line in text.splitlines() if request_id in line)
    assert secret[:17] in line  # the display prefix identifies the key
    assert secret not in text and secret[:-1] not in text
    assert canary not in text
