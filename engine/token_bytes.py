"""The raw bytes each token id stands for: the `bytes` of OpenAI's logprobs.

OpenAI documents `bytes` as the token's UTF-8 bytes, there so that a client can
rebuild characters split across tokens: byte-level BPE cuts a Chinese
character or an emoji into two or three tokens, none of which is valid UTF-8
alone. Decoding such a token by itself gives U+FFFD, and the UTF-8 of U+FFFD
(EF BF BD) is not the token's bytes, so `bytes` cannot be taken from the
decoded text; it is read from the vocabulary instead, as the decoder would
turn each vocabulary string into bytes:

- byte-level (GPT-2, Llama 3, Qwen2): each character of the vocabulary string
  is one byte through GPT-2's byte-to-unicode table;
- SentencePiece-style (Llama 2, Mistral): `▁` is a space and `<0xNN>` the byte
  NN (byte fallback). Decoding one token alone also strips its leading space
  (the decoder's `Strip`), which the raw bytes keep, as a completion's text
  does for a word in the middle of it;
- anything else: the token decoded alone.

Added tokens (special or not) are their content.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Literal

from tokenizers import Tokenizer as BackendTokenizer

Scheme = Literal["byte_level", "sentencepiece", "decoded"]
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_SPACE_MARK = "\u2581"  # SentencePiece's "▁"


def _gpt2_unicode_to_byte() -> dict[str, int]:
    """GPT-2's `bytes_to_unicode` table, inverted: printable bytes stand for themselves, the
    others for the code points from 256 upwards, in byte order."""
    printable = {
        *range(ord("!"), ord("~") + 1),
        *range(ord("\u00a1"), ord("\u00ac") + 1),
        *range(ord("\u00ae"), ord("\u00ff") + 1),
    }
    table: dict[str, int] = {}
    shifted = 0
    for byte in range(256):
        if byte in printable:
            table[chr(byte)] = byte
        else:
            table[chr(256 + shifted)] = byte
            shifted += 1
    return table


_UNICODE_TO_BYTE = _gpt2_unicode_to_byte()


def decoder_scheme(backend: BackendTokenizer) -> Scheme:
    """How the backend's decoder turns vocabulary strings into bytes (read from its config)."""
    decoder = backend.decoder
    if decoder is None:
        return "decoded"
    config: dict[str, Any] = json.loads(decoder.__getstate__())
    parts = config.get("decoders", [config]) if config.get("type") == "Sequence" else [config]
    kinds = {part.get("type") for part in parts}
    if "ByteLevel" in kinds:
        return "byte_level"
    replaces_mark = any(
        part.get("type") == "Replace" and part.get("pattern", {}).get("String") == _SPACE_MARK
        for part in parts
    )
    if "ByteFallback" in kinds or "Metaspace" in kinds or replaces_mark:
        return "sentencepiece"
    return "decoded"


class TokenBytes:
    """`bytes_of(token_id)` for one tokenizer; unknown ids give b""."""

    def __init__(self, backend: BackendTokenizer, decode_one: Callable[[int], str]) -> None:
        self._backend = backend
        self._decode_one = decode_one
        self.scheme = decoder_scheme(backend)
        self._added = {
            int(token_id): token.content
            for token_id, token in backend.get_added_tokens_decoder().items()
        }

    def bytes_of(self, token_id: int) -> bytes:
        added = self._added.get(token_id)
        if added is not None:
            return added.encode()
        piece = self._backend.id_to_token(token_id)
        if piece is None:
            return b""
        if self.scheme == "byte_level":
            try:
                return bytes(_UNICODE_TO_BYTE[char] for char in piece)
            except KeyError:  # a piece outside the byte alphabet: trust the decoder
                return self._decode_one(token_id).encode()
        if self.scheme == "sentencepiece":
            byte = _BYTE_TOKEN.fullmatch(piece)
            if byte is not None:
                return bytes([int(byte.group(1), 16)])
            return piece.replace(_SPACE_MARK, " ").encode()
        return self._decode_one(token_id).encode()
