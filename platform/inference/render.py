"""Engine chunks → OpenAI response bodies and server-sent events.

One accumulator per request builds the non-streamed body from the same
chunks the streamed path forwards, so both report identical text and usage.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field

import msgspec

from hydrant.engine.protocol import ChoiceDelta, GenerateChunk, RequestUsage, TokenLogprob
from hydrant.engine.tokenizer import Tokenizer
from hydrant.platform.inference import schemas as s
from hydrant.platform.inference.chat.reasoning import reasoning_tokens
from hydrant.platform.inference.params import PreparedRequest
from hydrant.platform.inference.service import Generation

_encoder = msgspec.json.Encoder()


def usage_body(usage: RequestUsage, reasoning: int | None = None) -> s.Usage:
    """`reasoning`: the thinking tokens of a model that thinks (None: it does not)."""
    return s.Usage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.prompt_tokens + usage.completion_tokens,
        prompt_tokens_details=s.PromptTokensDetails(cached_tokens=usage.cached_tokens),
        completion_tokens_details=(
            None if reasoning is None else s.CompletionTokensDetails(reasoning_tokens=reasoning)
        ),
    )


def thinking_tokens(
    tokenizer: Tokenizer, prepared: PreparedRequest, outputs: Iterable[Sequence[int]]
) -> int | None:
    """The thinking tokens of all of a request's choices (None: the model does not think)."""
    if prepared.thinking is None:
        return None
    return sum(reasoning_tokens(tokenizer, ids, prepared.thinking) for ids in outputs)


def token_piece(tokenizer: Tokenizer, token_id: int) -> tuple[str, list[int]]:
    """A token's text and UTF-8 bytes for logprobs: the bytes are the token's own (a piece of a
    character split across tokens stays rebuildable), the text is them decoded (U+FFFD for a
    piece)."""
    raw = tokenizer.token_bytes(token_id)
    return raw.decode("utf-8", errors="replace"), list(raw)


@dataclass
class Choice:
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None


class Accumulator:
    """Collects the chunks of a request into per-choice text, logprobs and finish reasons.
    Choice `i` of prompt `p` is choice `p * n + i` of the response (a batched completion)."""

    def __init__(self, prompts: int, n: int) -> None:
        self.n = n
        self.choices = [Choice() for _ in range(prompts * n)]
        self.prompt_logprobs: list[list[TokenLogprob | None] | None] = [None] * prompts

    def add(self, prompt: int, delta: ChoiceDelta) -> None:
        choice = self.choices[prompt * self.n + delta.index]
        choice.text.append(delta.text)
        choice.token_ids.extend(delta.token_ids)
        if delta.logprobs:
            choice.logprobs.extend(delta.logprobs)
        if delta.finish_reason:
            choice.finish_reason = delta.finish_reason


async def collect(generation: Generation) -> Accumulator:
    prepared = generation.ctx.prepared
    accumulator = Accumulator(len(prepared.prompts), prepared.settings.n)
    async for prompt, chunk in generation:
        if chunk.prompt_logprobs is not None:
            accumulator.prompt_logprobs[prompt] = chunk.prompt_logprobs
        for delta in chunk.choices:
            accumulator.add(prompt, delta)
    return accumulator


# Characters JSON may carry raw inside strings but that line splitters other than the SSE
# spec's treat as line ends (Python's str.splitlines, hence httpx's iter_lines; JavaScript
# before ES2019 for U+2028/9): written escaped, an event is one line for every client.
# In UTF-8 these byte runs can only be these characters, so the swap cannot touch others.
_LINE_BREAKERS = (
    (b"\xc2\x85", b"\\u0085"),
    (b"\xe2\x80\xa8", b"\\u2028"),
    (b"\xe2\x80\xa9", b"\\u2029"),
)


def _one_line(data: bytes) -> bytes:
    if data.isascii():  # nearly every event: nothing to look for
        return data
    for raw, escaped in _LINE_BREAKERS:
        if raw in data:
            data = data.replace(raw, escaped)
    return data


def sse(payload: object) -> bytes:
    """One SSE event: `data: <JSON>` on a single line, whatever text the tokens decode to."""
    return b"data: " + _one_line(_encoder.encode(payload)) + b"\n\n"


_CHOICES = b'"choices":[]'
_USAGE = b'"usage":null}'


class ChunkTemplate:
    """The SSE events of one stream's chunks, with the parts every chunk repeats (`id`,
    `object`, `created`, `model`, `system_fingerprint`) encoded once per stream.

    Per token only the choices (and the final usage) are encoded; the bytes are
    exactly `sse(chunk)` of the whole chunk. `prototype` is the stream's chunk with
    no choices and no usage; its JSON must have `choices` before a final `usage`
    (the streamed chunk structs do), else this refuses it.
    """

    __slots__ = ("_head", "_middle")

    def __init__(self, prototype: object) -> None:
        data = _one_line(_encoder.encode(prototype))
        # Unique: inside a JSON string a quote is escaped, so this cannot occur there.
        head, found, rest = data.partition(_CHOICES)
        if not found or not rest.endswith(_USAGE) or _CHOICES in rest:
            raise ValueError("the chunk's JSON needs empty `choices` before a final null `usage`")
        self._head = b"data: " + head + _CHOICES[:-2]
        self._middle = rest[: -len(b"null}")]

    def event(self, choices: object, usage: object | None = None) -> bytes:
        """The event of the chunk with these choices (a list of choice structs) and usage."""
        encoded_usage = b"null" if usage is None else _one_line(_encoder.encode(usage))
        return b"".join(
            (
                self._head,
                _one_line(_encoder.encode(choices)),
                self._middle,
                encoded_usage,
                b"}\n\n",
            )
        )


DONE = b"data: [DONE]\n\n"


async def events(
    generation: Generation,
    first_event: Callable[[int, GenerateChunk | None], bytes] | None,
    delta_event: Callable[[int, ChoiceDelta], bytes | None],
    usage_event: Callable[[RequestUsage], bytes],
    error_event: Callable[[str], bytes],
    *,
    first_after_prefill: bool = False,
    outputs: dict[int, list[int]] | None = None,
) -> AsyncIterator[bytes]:
    """The SSE events of a generation, each choice under its response index (`p * n + i` for
    choice `i` of prompt `p`). The callables return finished events (`sse()`, or a stream's
    `ChunkTemplate`). The first events (one per choice) go out at once, or with
    `first_after_prefill` along with the prompt's first chunk (an echo that carries the
    prompt's logprobs, which exist once the prompt is computed). `outputs`, when given,
    collects each choice's token ids, those of deltas with no text too."""
    prepared = generation.ctx.prepared
    n = prepared.settings.n
    if first_event is not None and not first_after_prefill:
        for index in range(prepared.choices):
            yield first_event(index, None)
        first_event = None
    opened = [first_event is None] * len(prepared.prompts)  # its first events are out
    try:
        async for prompt, chunk in generation:
            if not opened[prompt] and first_event is not None:  # a scored prompt: off the loop
                for index in range(prompt * n, prompt * n + n):
                    yield await asyncio.to_thread(first_event, index, chunk)
                opened[prompt] = True
            for delta in chunk.choices:
                if outputs is not None:
                    outputs.setdefault(prompt * n + delta.index, []).extend(delta.token_ids)
                # A token whose text is empty (a special token, a byte of a character still
                # incomplete) is an event too, as vLLM streams it: the client sees each token
                # when it is made, so its first-token time and its read timeouts count tokens,
                # not text; a run of such tokens could otherwise leave a stream silent to its end.
                if delta.token_ids or delta.text or delta.finish_reason or delta.logprobs:
                    event = delta_event(prompt * n + delta.index, delta)
                    if event is not None:  # None: nothing to send yet (text held back)
                        yield event
            if chunk.error:
                yield error_event(chunk.error)
    except Exception:  # the engine or worker failed mid-stream: end with an error event
        yield error_event("the model failed while generating; the response is incomplete")
        yield DONE
        return
    if prepared.include_usage:
        yield usage_event(generation.usage())
    yield DONE


def stream_error(message: str) -> bytes:
    """The event a stream ends with when the model failed mid-way (OpenAI's error shape)."""
    return sse(
        {
            "error": {
                "message": message,
                "type": "server_error",
                "param": None,
                "code": "generation_failed",
            }
        }
    )
