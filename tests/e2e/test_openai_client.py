"""The official `openai` client against a real `hydrant serve` process.

Usage reported to the client must equal what the ledger recorded, and the
prompt token count must equal what the model's own tokenizer gives.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from hydrant_server import RunningServer, hydrant_server

from hydrant.engine.tokenizer import Tokenizer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(
    demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    with hydrant_server(tmp_path_factory.mktemp("serve"), demo_model_dir) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    _, secret = server.tenant_key("openai-client")
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=secret, max_retries=0)


def _ledger(server: RunningServer, request_id: str) -> tuple[object, ...] | None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with sqlite3.connect(server.data_dir / "hydrant.db") as db:
            row = db.execute(
                "SELECT status, input_tokens, cached_tokens, output_tokens, charged "
                "FROM ledger_entries WHERE request_id = ?",
                (request_id,),
            ).fetchone()
        if row is not None:
            return tuple(row)
        time.sleep(0.1)
    return None


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
    entry = _ledger(server, request_id)
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
    entry = _ledger(server, raw.headers["x-request-id"])
    assert entry is not None
    status, input_tokens, _, output_tokens, _ = entry
    assert (status, input_tokens, output_tokens) == (
        "finished",
        usage.prompt_tokens,
        usage.completion_tokens,
    )
    assert _ledger(server, raw.headers["x-request-id"] + "-0") is None  # one entry, not three

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


def test_models_list(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["demo"]


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
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()


def test_every_response_has_a_request_id(server: RunningServer) -> None:
    for path in ("/healthz", "/v1/models", "/no/such/route"):
        response = httpx.get(server.base_url + path)
        assert response.headers["x-request-id"].startswith("req_"), path


def test_logs_carry_ids_but_never_the_key_or_the_prompt(server: RunningServer) -> None:
    canary = "canary-prompt-zebra-quartz-7731"
    _, secret = server.tenant_key("log-audit")
    audit = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=secret, max_retries=0)
    raw = audit.chat.completions.with_raw_response.create(
        model="demo", messages=[{"role": "user", "content": canary}], max_tokens=3
    )
    request_id = raw.headers["x-request-id"]
    with pytest.raises(openai.AuthenticationError):  # a wrong key is logged by nobody either
        openai.OpenAI(
            base_url=f"{server.base_url}/v1", api_key=secret[:-1] + "x", max_retries=0
        ).models.list()
    deadline = time.monotonic() + 5
    while request_id not in server.log_file.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    text = server.log_file.read_text()
    line = next(line for line in text.splitlines() if request_id in line)
    assert secret[:17] in line  # the display prefix identifies the key
    assert secret not in text and secret[:-1] not in text
    assert canary not in text
