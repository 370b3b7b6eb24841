"""Turning a stream of token ids into a stream of text, and finding stop strings in it.

Byte-level BPE splits a multi-byte character (Chinese, emoji) across tokens,
so decoding one token at a time would emit halves of characters, which UTF-8
decoding shows as U+FFFD. `IncrementalDetokenizer` decodes a short sliding
window instead (the approach of vLLM and HF's TextStreamer): the text of the
window is emitted only once it no longer ends in U+FFFD, so a character is
released when its last byte has arrived, and the concatenated deltas equal
the full decode. The window starts a few tokens back in the prompt, because
SentencePiece-style decoders drop the leading space of the first token of a
decode, which would glue the first output word to the prompt.

The window steps in Rust (`tokenizers.decoders.DecodeStream`: the same
prefix/read-offset algorithm, without a Python list and two decode calls per
token), whenever the tokenizer is a `tokenizers` one. DecodeStream refuses a
window whose text does not extend the text before it (it raises "invalid
prefix": a decoder that rewrites earlier text, such as a stripped space, on
unusual token runs); the Python window, which cuts by length as before, then
takes that sequence over from the same offsets, so the text never differs.

`StopStringMatcher` finds stop strings in the growing text, looking only at
the tail a new delta can complete, and tells a streaming front how much text
to hold back because it may still turn into a stop string.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tokenizers import Tokenizer as BackendTokenizer
from tokenizers.decoders import DecodeStream

REPLACEMENT_CHAR = "\ufffd"
# Prompt tokens of context before the first output token (vLLM uses 5 too).
PROMPT_CONTEXT_TOKENS = 5


class _Decoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """The output text of one sequence, grown one token at a time."""

    def __init__(
        self,
        tokenizer: _Decoder,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        context = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        # A prompt whose tail is itself a broken character would shift every
        # later delta by the width of the U+FFFD; start without context then.
        if self._decode(context).endswith(REPLACEMENT_CHAR):
            context = []
        self._ids: list[int] = context
        self._prefix_offset = 0  # window start: decoded only to be subtracted
        self._read_offset = len(context)  # text before this is already emitted
        self._parts: list[str] = []
        self._joined = 0  # how many of _parts _text_cache holds
        self._text_cache = ""
        backend = getattr(tokenizer, "backend", None)
        self._backend = backend if isinstance(backend, BackendTokenizer) else None
        self._stream = (
            DecodeStream(list(context), skip_special_tokens) if self._backend is not None else None
        )

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)

    def add(self, token_id: int) -> str:
        """Append one token; return the text it completes ("" while a character is unfinished)."""
        self._ids.append(token_id)
        if self._stream is not None and self._backend is not None:
            try:
                delta = self._stream.step(self._backend, token_id)
            except Exception:  # "invalid prefix" (a bare Exception from tokenizers)
                self._stream = None  # the Python window continues from the same offsets
            else:
                if delta is None:
                    return ""
                self._prefix_offset = self._read_offset
                self._read_offset = len(self._ids)
                self._parts.append(delta)
                return delta
        return self._add_window()

    def _add_window(self) -> str:
        """The Python window: decode the window and the text before it, emit the growth."""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        window_text = self._decode(self._ids[self._prefix_offset :])
        if len(window_text) <= len(prefix_text) or window_text.endswith(REPLACEMENT_CHAR):
            return ""
        delta = window_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self._parts.append(delta)
        return delta

    def flush(self) -> str:
        """Release text still held back at the end of the sequence.

        Only needed when a sequence ends inside an incomplete character (the
        model emitted bytes that never form one): the rest then comes out with
        its U+FFFD, as a full decode would show it.
        """
        if self._read_offset == len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        window_text = self._decode(self._ids[self._prefix_offset :])
        delta = window_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        if delta:
            self._parts.append(delta)
        return delta

    @property
    def text(self) -> str:
        """All output text emitted so far."""
        if self._joined != len(self._parts):
            self._text_cache += "".join(self._parts[self._joined :])
            self._joined = len(self._parts)
        return self._text_cache


class StopStringMatcher:
    """Finds the first stop string in a sequence's output text.

    "First" is the one whose last character arrives first, which is the one a
    character-by-character stream would have stopped at, so the result does
    not depend on how the text was split into tokens.
    """

    def __init__(self, stops: Sequence[str], *, include_stop_str: bool = False) -> None:
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        self.stops = tuple(dict.fromkeys(stops))
        self.include_stop_str = include_stop_str
        self.max_holdback = max((len(s) for s in self.stops), default=1) - 1
        self.last_match: str | None = None

    def check(self, text: str, new_len: int) -> int | None:
        """The cut position in `text` if a stop string now appears, else None.

        `new_len` is how many characters at the end of `text` are new since
        the last call; only matches ending in them are looked for. The cut
        is where the stop string starts, or where it ends when
        `include_stop_str` is set; `last_match` names the stop string found.
        """
        if new_len <= 0 or not self.stops:
            return None
        new_start = len(text) - new_len
        best: tuple[int, int, str] | None = None  # (end, start, stop)
        for stop in self.stops:
            begin = max(0, new_start - len(stop) + 1)
            start = text.find(stop, begin)
            if start < 0:
                continue
            end = start + len(stop)
            candidate = (end, start, stop)
            if best is None or candidate < best:
                best = candidate
        if best is None:
            return None
        end, start, stop = best
        self.last_match = stop
        return end if self.include_stop_str else start

    def holdback_len(self, text: str) -> int:
        """Characters at the end of `text` that may still grow into a stop string.

        A streaming front sends `text[:len(text) - holdback_len(text)]`; this is
        at most `max_holdback` and usually 0, so streams are not delayed
        needlessly.
        """
        longest = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest
