"""A model's tokenizer, read from its HF files without importing transformers.

The engine must tokenize exactly as transformers would on the same directory
(the model was trained on that), but transformers is a heavy import that the
worker does not otherwise need. So this class reads the same files the way
transformers' fast tokenizer does: `tokenizer.json` through `tokenizers`, the
named special tokens and the chat template from `tokenizer_config.json`
(`chat_template.jinja` takes priority when present), and the end-of-sequence
ids from every place a checkpoint may declare them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as BackendTokenizer

from hydrant.engine.chat_template import render_chat_template
from hydrant.engine.errors import ChatTemplateError, ModelLoadError
from hydrant.engine.token_bytes import TokenBytes
from hydrant.engine.tokenizer_files import (
    NAMED_SPECIAL_TOKENS,
    add_missing_tokens,
    ensure_post_processor,
    id_list,
    read_chat_template,
    read_json,
    token_content,
)


class Tokenizer:
    """Encode, decode and render chat prompts for one model."""

    def __init__(
        self,
        backend: BackendTokenizer,
        *,
        special_tokens_map: Mapping[str, str],
        eos_token_ids: frozenset[int],
        bos_token_id: int | None,
        chat_template: str | None = None,
        model_max_length: int | None = None,
    ) -> None:
        self._backend = backend
        self._special_tokens_map = dict(special_tokens_map)
        self._eos_token_ids = eos_token_ids
        self._bos_token_id = bos_token_id
        self.chat_template = chat_template
        self.model_max_length = model_max_length
        added = backend.get_added_tokens_decoder()
        special = {i for i, tok in added.items() if tok.special} | set(eos_token_ids)
        if bos_token_id is not None:
            special.add(bos_token_id)
        self._special_token_ids = frozenset(special)
        self._token_bytes = TokenBytes(backend, lambda i: self.decode([i], False))

    @classmethod
    def from_pretrained(cls, model_dir: Path) -> Tokenizer:
        """Load from a checkpoint directory; only `tokenizer.json` is required."""
        model_dir = Path(model_dir)
        tokenizer_file = model_dir / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise ModelLoadError(f"{model_dir} has no tokenizer.json")
        try:
            backend = BackendTokenizer.from_file(str(tokenizer_file))
        except Exception as exc:  # tokenizers raises a bare Exception on bad files
            raise ModelLoadError(f"cannot load {tokenizer_file}: {exc}") from exc
        config = read_json(model_dir / "tokenizer_config.json")
        legacy_map = read_json(model_dir / "special_tokens_map.json")
        generation = read_json(model_dir / "generation_config.json")
        model_config = read_json(model_dir / "config.json")

        special_tokens_map: dict[str, str] = {}
        for name in NAMED_SPECIAL_TOKENS:
            content = token_content(config.get(name)) or token_content(legacy_map.get(name))
            if content is not None:
                special_tokens_map[name] = content
        add_missing_tokens(backend, config, special_tokens_map)
        ensure_post_processor(backend, config, special_tokens_map)

        eos: set[int] = set()
        eos_token = special_tokens_map.get("eos_token")
        eos_id = backend.token_to_id(eos_token) if eos_token is not None else None
        if eos_id is not None:
            eos.add(int(eos_id))
        eos.update(id_list(generation.get("eos_token_id")))
        if not eos:
            eos.update(id_list(model_config.get("eos_token_id")))

        bos_id: int | None = None
        bos_token = special_tokens_map.get("bos_token")
        if bos_token is not None:
            bos_id = backend.token_to_id(bos_token)
        if bos_id is None:
            for source in (generation, model_config):
                ids = id_list(source.get("bos_token_id"))
                if ids:
                    bos_id = ids[0]
                    break
        max_len = config.get("model_max_length")
        return cls(
            backend,
            special_tokens_map=special_tokens_map,
            eos_token_ids=frozenset(eos),
            bos_token_id=bos_id,
            chat_template=read_chat_template(model_dir, config),
            model_max_length=max_len if isinstance(max_len, int) and max_len < 10**12 else None,
        )

    @property
    def backend(self) -> BackendTokenizer:
        """The `tokenizers` object itself (incremental decoding steps it in Rust)."""
        return self._backend

    def backend_json(self) -> str:
        """The `tokenizers` serialization (tokenizer.json's text): what llguidance reads."""
        return str(self._backend.to_str())

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer knows, added tokens included (transformers' len())."""
        return int(self._backend.get_vocab_size(with_added_tokens=True))

    @property
    def bos_token_id(self) -> int | None:
        return self._bos_token_id

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Every id that ends a sequence: the tokenizer's eos plus generation_config's list."""
        return self._eos_token_ids

    @property
    def special_token_ids(self) -> frozenset[int]:
        return self._special_token_ids

    @property
    def special_tokens_map(self) -> dict[str, str]:
        return dict(self._special_tokens_map)

    def token_to_id(self, token: str) -> int | None:
        token_id = self._backend.token_to_id(token)
        return None if token_id is None else int(token_id)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The text's token ids. `encode_batch_fast` of one text: `encode` also works out each
        token's character offsets, which nothing here reads (a quarter of its time on the
        demo tokenizer), and every prompt the gateway meters is encoded before it is
        admitted, on the path to its first token."""
        (encoding,) = self._backend.encode_batch_fast([text], add_special_tokens=add_special_tokens)
        return list(encoding.ids)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes this token adds to a text (logprobs' `bytes`; see engine/token_bytes.py)."""
        return self._token_bytes.bytes_of(token_id)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Decode as transformers does for BPE models (it skips its space clean-up for BPE)."""
        return str(self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        extra_context: Mapping[str, Any] | None = None,
    ) -> str:
        """Render the conversation to the prompt text; raises ChatTemplateError (a 400)."""
        if self.chat_template is None:
            raise ChatTemplateError("this model has no chat template; use the completions API")
        return render_chat_template(
            self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            special_tokens=self._special_tokens_map,
            tools=tools,
            extra_context=extra_context,
        )

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """Token ids of the rendered conversation (see `render_chat`)."""
        return self.render_chat(messages, add_generation_prompt, tools=tools)[1]

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        extra_context: Mapping[str, Any] | None = None,
    ) -> tuple[str, list[int]]:
        """The rendered conversation and its token ids.

        Like transformers' `apply_chat_template(tokenize=True)`, the text is
        encoded without adding special tokens: templates write their own BOS,
        and adding another would give the model a double BOS it never saw.
        """
        text = self.apply_chat_template(
            messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            extra_context=extra_context,
        )
        return text, self.encode(text, add_special_tokens=False)
