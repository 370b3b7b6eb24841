"""Reading the tokenizer-related files of a HF checkpoint the way transformers does.

Kept apart from `tokenizer.py` so that class reads as the tokenizer's API and
this module as the (fiddly) rules for where each setting comes from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, processors
from tokenizers import Tokenizer as BackendTokenizer

from hydrant.engine.errors import ModelLoadError

# The named special tokens transformers exposes to chat templates.
NAMED_SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {path.name}: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path.name} does not hold a JSON object")
    return data


def token_content(value: object) -> str | None:
    """A special token in a config file is a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def id_list(value: object) -> list[int]:
    """`eos_token_id` may be one int or a list of them (Llama 3 instruct lists three)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def read_chat_template(model_dir: Path, config: Mapping[str, Any]) -> str | None:
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text("utf-8")
    template = config.get("chat_template")
    if isinstance(template, str):
        return template
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        default = named.get("default")
        return default if isinstance(default, str) else None
    return None


def add_missing_tokens(
    backend: BackendTokenizer, config: Mapping[str, Any], named: Mapping[str, str]
) -> None:
    """Tokens the config declares but tokenizer.json lacks are added, as transformers does."""
    declared = config.get("added_tokens_decoder")
    to_add: list[AddedToken] = []
    if isinstance(declared, Mapping):
        for _index, spec in sorted(declared.items(), key=lambda item: int(item[0])):
            content = token_content(spec)
            if content is None or backend.token_to_id(content) is not None:
                continue
            options = {
                k: bool(spec[k])
                for k in ("single_word", "lstrip", "rstrip", "normalized", "special")
                if k in spec
            }
            to_add.append(AddedToken(content, **options))
    pending = {t.content for t in to_add}
    for content in named.values():
        if backend.token_to_id(content) is None and content not in pending:
            to_add.append(AddedToken(content, special=True, normalized=False))
            pending.add(content)
    if to_add:
        backend.add_tokens(to_add)


def ensure_post_processor(
    backend: BackendTokenizer, config: Mapping[str, Any], named: Mapping[str, str]
) -> None:
    """tokenizer.json's post-processor decides BOS/EOS; without one, the config's flags do.

    That is the Llama tokenizer behaviour: `add_bos_token` (default off here,
    as in transformers' generic fast tokenizer) and `add_eos_token` build a
    TemplateProcessing when the file has none.
    """
    if backend.post_processor is not None:
        return
    bos, eos = named.get("bos_token"), named.get("eos_token")
    add_bos = config.get("add_bos_token") is True and bos is not None
    add_eos = config.get("add_eos_token") is True and eos is not None
    special: list[tuple[str, int]] = []
    for wanted, token in ((add_bos, bos), (add_eos, eos)):
        token_id = backend.token_to_id(token) if wanted and token is not None else None
        if token is not None and token_id is not None:
            special.append((token, int(token_id)))
    if not special:
        return

    def sequence(name: str, type_id: int) -> str:
        head = f"{bos}:{type_id} " if add_bos else ""
        tail = f" {eos}:{type_id}" if add_eos else ""
        return f"{head}${name}:{type_id}{tail}"

    backend.post_processor = processors.TemplateProcessing(
        single=sequence("A", 0),
        pair=f"{sequence('A', 0)} {sequence('B', 1)}",
        special_tokens=special,
    )
