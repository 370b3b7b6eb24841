"""SSE events stay one line for every client, whatever text the tokens decode to."""

from __future__ import annotations

import json

import pytest

from hydrant.platform.inference import schemas as s
from hydrant.platform.inference.render import ChunkTemplate, sse

# Every character Python's str.splitlines breaks on (httpx's iter_lines uses it).
LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def test_an_event_with_every_line_breaking_character_is_one_line_and_round_trips() -> None:
    text = f"a{LINE_BREAKS}b 。 é"
    event = sse({"choices": [{"delta": {"content": text}}]})
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    line = event[: -len(b"\n\n")].decode("utf-8")
    assert line.splitlines() == [line]  # no splitter finds a break inside the event
    assert json.loads(line[len("data: ") :]) == {"choices": [{"delta": {"content": text}}]}


def test_text_without_such_characters_is_left_as_the_encoder_wrote_it() -> None:
    event = sse({"content": "plain 。 text"})
    assert event == 'data: {"content":"plain 。 text"}\n\n'.encode()


# Model names and texts the constant parts and the choices must survive byte for byte.
NAMES = ["demo", 'we"ird \\ "choices":[] name', f"line{LINE_BREAKS}breaks 。"]
TEXTS = ["", "plain", f"a{LINE_BREAKS}b 。 é", '"usage":null}']
USAGE = s.Usage(
    prompt_tokens=3,
    completion_tokens=5,
    total_tokens=8,
    prompt_tokens_details=s.PromptTokensDetails(cached_tokens=1),
)


@pytest.mark.parametrize("model", NAMES)
@pytest.mark.parametrize("text", TEXTS)
def test_a_chat_chunk_from_the_template_is_the_same_bytes_as_sse_of_the_chunk(
    model: str, text: str
) -> None:
    template = ChunkTemplate(
        s.ChatCompletionChunk(id="chatcmpl-1", created=7, model=model, choices=[])
    )
    choices = [
        s.ChatChunkChoice(
            index=2, delta=s.ChatDelta(content=text), logprobs=None, finish_reason=None
        )
    ]
    for picked, usage in ((choices, None), ([], USAGE)):
        whole = s.ChatCompletionChunk(
            id="chatcmpl-1", created=7, model=model, choices=picked, usage=usage
        )
        assert template.event(picked, usage) == sse(whole)


@pytest.mark.parametrize("model", NAMES)
@pytest.mark.parametrize("text", TEXTS)
def test_a_completion_chunk_from_the_template_is_the_same_bytes_as_sse_of_the_chunk(
    model: str, text: str
) -> None:
    template = ChunkTemplate(s.Completion(id="cmpl-1", created=7, model=model, choices=[]))
    choices = [s.CompletionChoice(index=0, text=text, logprobs=None, finish_reason="length")]
    for picked, usage in ((choices, None), ([], USAGE)):
        whole = s.Completion(id="cmpl-1", created=7, model=model, choices=picked, usage=usage)
        event = template.event(picked, usage)
        assert event == sse(whole)
        line = event[: -len(b"\n\n")].decode("utf-8")
        assert line.splitlines() == [line]


def test_a_prototype_without_choices_before_a_final_usage_is_refused() -> None:
    with pytest.raises(ValueError, match="choices"):
        ChunkTemplate({"usage": None, "choices": []})
    with pytest.raises(ValueError, match="choices"):
        ChunkTemplate({"choices": [1], "usage": None})
