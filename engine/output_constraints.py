"""Output constraints as data, and whether one compiles: what the gateway may import.

A request's constraint on its output is a `(kind, spec)` pair: a JSON schema
(OpenAI's `response_format`), or vLLM's `structured_outputs` regex, choice or
grammar. This module says which kinds exist, names the request field each comes
from (for errors), and checks a constraint the way the engine will compile it
(`constraint_error`), with llguidance and no torch: the gateway checks it before
dispatch, and the control plane never imports torch. The engine's side (one
parser per sequence, masks on the logits) is engine/structured_output.py.

`constraint_error` checks a schema against JSON Schema's meta-schema first,
then compiles; for a large schema that takes a fraction of a second (0.3 s for
25 KB, most of it the pure-Python meta-schema check), so the gateway and the
engine's async front run it in a thread, off their event loops, and its cache
answers the later calls.
"""

from __future__ import annotations

import functools
import json
from typing import Any, NoReturn

import jsonschema
import llguidance

from hydrant.engine.errors import InvalidRequestError

# json: a JSON schema (JSON text); regex: Rust `regex` syntax; choice: a JSON list of
# strings; grammar: Lark or GBNF (llguidance's dialect).
KINDS = ("json", "regex", "choice", "grammar")
# A spec larger than this is refused before it is compiled (a request body is bounded
# anyway; this keeps one request from spending seconds of parser construction).
MAX_SPEC_BYTES = 64 * 1024
MAX_CHOICES = 1024
JSON_OBJECT_SCHEMA = '{"type":"object"}'  # OpenAI's "json_object" mode: any JSON object
_COMPILE_OPTIONS: Any = {"whitespace_flexible": False}


def canonical_schema(schema: Any) -> str:
    """The schema as compact JSON with sorted keys: one text per schema, for caching."""
    return json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def request_field(kind: str) -> str:
    """The request field a constraint came from, for errors: OpenAI's for JSON, else vLLM's."""
    return "response_format" if kind == "json" else "structured_outputs"


@functools.lru_cache(maxsize=256)
def grammar(kind: str, spec: str) -> str:
    """The llguidance grammar of a constraint (cached: the engine builds a parser per sequence)."""
    if kind == "json":
        return str(llguidance.LLMatcher.grammar_from_json_schema(spec, _COMPILE_OPTIONS))
    return str(llguidance.grammar_from(kind, spec))  # type: ignore[arg-type]


def spec_error(kind: str, spec: str) -> str | None:
    """What is wrong with the spec itself, before llguidance sees it."""
    if kind not in KINDS:
        return f"the constraint kind must be one of {', '.join(KINDS)}, got {kind!r}"
    if len(spec.encode()) > MAX_SPEC_BYTES:
        return f"the {kind} is larger than {MAX_SPEC_BYTES} bytes"
    if kind == "choice":
        try:
            choices = json.loads(spec)
        except ValueError:
            choices = None
        if not (isinstance(choices, list) and 0 < len(choices) <= MAX_CHOICES) or not all(
            isinstance(c, str) and c for c in choices
        ):
            return f"choice must be a list of 1 to {MAX_CHOICES} non-empty strings"
    if kind != "json":
        return None if spec else f"the {kind} is empty"
    try:
        schema = json.loads(spec)
    except ValueError as exc:
        return f"the schema is not valid JSON: {exc}"
    if not isinstance(schema, dict):
        return "the schema must be a JSON object"
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        return f"not a valid JSON Schema{f' at {where}' if where else ''}: {exc.message}"
    return None


@functools.lru_cache(maxsize=256)
def constraint_error(kind: str, spec: str) -> str | None:
    """Why this constraint cannot guide generation, or None if it can.

    A schema is first checked against JSON Schema's own meta-schema: it gives the
    client a precise message, and llguidance 1.9 panics (a Rust panic, a
    BaseException here, its message on stderr) on some mistyped keywords instead of
    returning an error. A panic that still gets through is the spec's fault too,
    and reported as such.
    """
    problem = spec_error(kind, spec)
    if problem is not None:
        return problem
    try:
        message = str(llguidance.LLMatcher.validate_grammar(grammar(kind, spec)))
    except ValueError as exc:
        return f"the {kind} cannot be compiled: {exc}"
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # a panic inside llguidance
        return f"the {kind} cannot be compiled ({type(exc).__name__})"
    return message or None


def raise_if_invalid(kind: str, spec: str) -> None:
    """`constraint_error` as the engine's InvalidRequestError, naming the request field."""
    problem = constraint_error(kind, spec)
    if problem is not None:
        refuse(kind, problem)


def refuse(kind: str, problem: str) -> NoReturn:
    """Refuses a request's constraint in the words of the field the client sent it in."""
    field = request_field(kind)
    raise InvalidRequestError(f"{field}: {problem}", field)
