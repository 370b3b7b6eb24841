"""Rendering a model's chat template exactly as transformers' `apply_chat_template` does.

A checkpoint's template is untrusted code from the Hub, so it runs in jinja2's
ImmutableSandboxedEnvironment, sees only plain JSON data, and its namespaces
refuse underscore attributes. Everything else copies transformers
(`utils/chat_template_utils.py`): trim_blocks + lstrip_blocks, the
loopcontrols extension, a `{% generation %}` tag, a `tojson` that does not
HTML-escape, and the `raise_exception` / `strftime_now` globals. Matching it
byte for byte matters: a prompt rendered differently from what the model was
trained on silently degrades its answers.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from hydrant.engine.errors import ChatTemplateError

# Names a message's reasoning may be passed under; templates read the first.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` renders its body unchanged.

    transformers uses the tag to build assistant-token masks for training;
    serving only needs templates that use it to parse and render the same.
    """

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return str(caller())


class _TemplateDict:
    """`dict(...)` inside templates, without exposing the dict type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """A jinja2 namespace that rejects underscore names (a sandbox escape route)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # jinja2's own signature trick
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes, got {name!r}"
            )


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)  # local time, as in transformers


@lru_cache(maxsize=32)
def compile_chat_template(source: str) -> jinja2.Template:
    """Compile once per distinct template; a syntax error is the model's, reported clearly."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"the model's chat template does not compile: {exc}") from exc


def plain_template_data(value: Any) -> Any:
    """Rebuild `value` from plain JSON types, so a template can reach no method of a rich object."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain_template_data(k): plain_template_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_template_data(item) for item in value]
    if isinstance(value, tuple):
        return tuple(plain_template_data(item) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: plain_template_data(getattr(value, f.name)) for f in dataclasses.fields(value)
        }
    return f"<{type(value).__name__}>"


def _normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Drop None-valued keys and alias reasoning fields, as transformers does before rendering."""
    normalized: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, Mapping):
            raise ChatTemplateError(f"each message must be an object, got {type(message).__name__}")
        plain = {k: v for k, v in plain_template_data(message).items() if v is not None}
        reasoning = next((plain[k] for k in _REASONING_FIELDS if plain.get(k) is not None), None)
        if reasoning is not None:
            plain = {"thinking": reasoning, **plain, "reasoning_content": reasoning}
        normalized.append(plain)
    return normalized


def render_chat_template(
    source: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    special_tokens: Mapping[str, str] | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    documents: Sequence[Mapping[str, Any]] | None = None,
    extra_context: Mapping[str, Any] | None = None,
) -> str:
    """Render `messages` with the template `source`.

    `special_tokens` are the named tokens transformers puts in the context
    (`bos_token`, `eos_token`, `pad_token`, ...); `extra_context` overrides
    them, as keyword arguments to `apply_chat_template` do.
    """
    template = compile_chat_template(source)
    context: dict[str, Any] = {
        **plain_template_data(dict(special_tokens or {})),
        **plain_template_data(dict(extra_context or {})),
    }
    try:
        return template.render(
            messages=_normalize_messages(messages),
            tools=plain_template_data(list(tools)) if tools is not None else None,
            documents=plain_template_data(list(documents)) if documents is not None else None,
            add_generation_prompt=add_generation_prompt,
            **context,
        )
    except (jinja2.exceptions.TemplateError, TypeError) as exc:
        # TypeError: the template met a value of a shape it cannot handle
        # (e.g. list content where it concatenates strings): the request's fault.
        raise ChatTemplateError(f"the chat template rejected the conversation: {exc}") from exc
