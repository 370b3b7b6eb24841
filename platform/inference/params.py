"""From an OpenAI request to what the engine runs: prompt token ids and sampling settings.

Every check that can be made before the engine sees the request is made
here, with the OpenAI parameter named in the error, so bad input never costs
engine work and never reaches it as a 500.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import Any

from hydrant.engine.errors import InvalidRequestError
from hydrant.engine.output_constraints import (
    JSON_OBJECT_SCHEMA,
    canonical_schema,
    constraint_error,
)
from hydrant.engine.protocol import Sampling
from hydrant.engine.sampling_params import MAX_LOGPROBS
from hydrant.platform.errors import InvalidRequest, Unprocessable
from hydrant.platform.inference.chat.tools import ToolPlan
from hydrant.platform.inference.schemas import (
    SamplingFields,
)
from hydrant.platform.models.registry import ServedModel

MAX_N = 16
# A batched `/v1/completions` request runs one engine request per prompt; these bound what one
# HTTP request may hold (lm-evaluation-harness sends its `batch_size` prompts at once).
MAX_PROMPTS = 128
SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for json_schema.name


@dataclass(frozen=True)
class PreparedPrompt:
    """One prompt of a request: what one engine request runs."""

    token_ids: list[int]
    sampling: Sampling
    echo_text: str | None = None


@dataclass(frozen=True)
class PreparedRequest:
    """A request ready for quotas and dispatch: one prompt, or several for a batched
    `/v1/completions` request. The prompts share every setting but `max_tokens` (its default
    depends on each prompt's length); choice `i` of prompt `p` is the response's choice
    `p * n + i`, as OpenAI numbers them."""

    prompts: tuple[PreparedPrompt, ...]
    stream: bool
    include_usage: bool
    prompt_field: str = "messages"  # the request field that holds the prompt, for errors
    constraint_field: str = "response_format"  # or vLLM's structured_outputs, for errors
    tools: ToolPlan | None = None  # how the chat output becomes tool calls (None: text)
    thinking: bool | None = None  # reasoning.reasoning_start: None, or starts inside
    # what the answer repeats or follows from the request (Responses API; encoding_format)
    response_fields: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.prompts:
            raise ValueError("a prepared request has at least one prompt")

    @classmethod
    def single(
        cls,
        prompt_token_ids: list[int],
        sampling: Sampling,
        stream: bool = False,
        include_usage: bool = False,
        echo_text: str | None = None,
    ) -> PreparedRequest:
        return cls((PreparedPrompt(prompt_token_ids, sampling, echo_text),), stream, include_usage)

    @property
    def settings(self) -> Sampling:
        """What every prompt shares (n, logprobs, …); max_tokens is the first prompt's."""
        return self.prompts[0].sampling

    @property
    def choices(self) -> int:
        return len(self.prompts) * self.settings.n

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p.token_ids) for p in self.prompts)


def check_token_ids(ids: list[int], vocab: int, where: str, param: str) -> None:
    """Ids a client sent are ids of the model's vocabulary (else a 400, never an index error)."""
    if ids and (min(ids) < 0 or max(ids) >= vocab):  # in C: a prompt may hold 100k ids
        raise InvalidRequest(f"{where}: token ids must be in [0, {vocab})", param=param)


def _prompt_list(prompt: str | list[str | int | list[int]], field: str) -> list[str | list[int]]:
    """OpenAI's four prompt forms as a list of prompts: a string, token ids, or a list of
    either (a batch)."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise InvalidRequest(f"{field} must not be empty", param=field)
    kinds = set(map(type, prompt))  # in C: a prompt may hold 100k ids
    if kinds == {int}:
        return [prompt]  # type: ignore[list-item]
    if kinds == {str} or kinds == {list}:
        return prompt  # type: ignore[return-value]
    raise InvalidRequest(
        f"{field} must be a string, a list of token ids, or a list of strings or of token-id "
        "lists; not a mix",
        param=field,
    )


def truncation(value: int | None, model: ServedModel) -> int | None:
    """vLLM's `truncate_prompt_tokens` as the number of tokens each prompt keeps (None: all).

    A prompt keeps its *last* tokens, as vLLM's left truncation does: a completion goes
    on from the end of its text and an embedding is its last token's state, so the end
    is what must survive. -1 means the model's whole context; more than that is a 400
    rather than a silent cap, since the client asked for something this model cannot do.
    """
    if value is None:
        return None
    if value == -1:
        return model.max_model_len
    if value < 1:
        raise InvalidRequest(
            "truncate_prompt_tokens must be at least 1, or -1 for the model's context",
            param="truncate_prompt_tokens",
        )
    if value > model.max_model_len:
        raise InvalidRequest(
            f"truncate_prompt_tokens {value} is greater than this model's context of "
            f"{model.max_model_len} tokens",
            param="truncate_prompt_tokens",
        )
    return value


def prompt_token_lists(
    prompt: str | list[str | int | list[int]],
    model: ServedModel,
    *,
    field: str = "prompt",
    limit: int = MAX_PROMPTS,
    add_special_tokens: bool = True,
    keep: int | None = None,
) -> list[list[int]]:
    """The token ids of each prompt of a completion (or input of an embedding request):
    one, or a batch of up to `limit`, each cut to its last `keep` tokens (see
    `truncation`)."""
    prompts = _prompt_list(prompt, field)
    if len(prompts) > limit:
        raise InvalidRequest(
            f"a request takes at most {limit} {field}s, got {len(prompts)}", param=field
        )
    batched = len(prompts) > 1
    vocab = model.tokenizer.vocab_size
    result = []
    for index, item in enumerate(prompts):
        where = f"{field}[{index}]" if batched else field
        if isinstance(item, str):
            ids = model.tokenizer.encode(item, add_special_tokens) if item else []
        else:
            ids = item
        if not ids:
            raise InvalidRequest(f"{where} must not be empty", param=field)
        check_token_ids(ids, vocab, where, field)
        result.append(ids if keep is None else ids[-keep:])
    return result


def _response_format(response_format: dict[str, Any] | None) -> tuple[str, str] | None:
    """OpenAI's `response_format` as the engine's constraint (None: free text).

    `json_object` is any JSON object; `json_schema` takes `{"name", "schema", "strict"}` and
    always enforces the schema (strict or not: the mask costs the same and never breaks it).
    """
    kind = (response_format or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return ("json", JSON_OBJECT_SCHEMA)
    if kind != "json_schema":
        raise InvalidRequest(
            f"response_format.type must be text, json_object or json_schema, got {kind!r}",
            param="response_format",
        )
    spec = (response_format or {}).get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise InvalidRequest(
            "response_format.json_schema must hold a `schema` object", param="response_format"
        )
    name = spec.get("name")
    if name is not None and not (isinstance(name, str) and SCHEMA_NAME.fullmatch(name)):
        raise InvalidRequest(
            "response_format.json_schema.name must be 1-64 letters, digits, _ or -",
            param="response_format",
        )
    return ("json", canonical_schema(spec["schema"]))


def _structured_outputs(options: dict[str, Any] | None) -> tuple[str, str] | None:
    """vLLM's `structured_outputs` (`json`, `json_object`, `regex`, `choice` or `grammar`,
    exactly one) as the engine's constraint."""
    given = {k: v for k, v in (options or {}).items() if v is not None and v is not False}
    unknown = sorted(set(given) - {"json", "json_object", "regex", "choice", "grammar"})
    if unknown:
        raise InvalidRequest(
            f"structured_outputs.{unknown[0]} is not supported; use json, json_object, regex, "
            "choice or grammar",
            param="structured_outputs",
        )
    if len(given) > 1:
        raise InvalidRequest(
            f"structured_outputs takes one constraint, got {', '.join(sorted(given))}",
            param="structured_outputs",
        )
    if not given:
        return None
    ((kind, value),) = given.items()
    if kind == "json_object":
        return ("json", JSON_OBJECT_SCHEMA)
    if kind == "json" and isinstance(value, str):  # vLLM takes the schema as text too
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise InvalidRequest(
                f"structured_outputs.json is not valid JSON: {exc}", param="structured_outputs"
            ) from exc
    expected = {"json": dict, "regex": str, "choice": list, "grammar": str}[kind]
    if not isinstance(value, expected):
        raise InvalidRequest(
            f"structured_outputs.{kind} must be a {expected.__name__}", param="structured_outputs"
        )
    if kind == "json":
        return ("json", canonical_schema(value))
    if kind == "choice":
        return ("choice", json.dumps(value, ensure_ascii=False))
    return (kind, value)


def output_constraint(fields: SamplingFields) -> tuple[tuple[str, str] | None, str]:
    """The request's output constraint, and the field it came from (for errors)."""
    openai_style = _response_format(fields.response_format)
    vllm_style = _structured_outputs(fields.structured_outputs)
    if openai_style is not None and vllm_style is not None:
        raise InvalidRequest(
            "send response_format or structured_outputs, not both", param="structured_outputs"
        )
    if vllm_style is not None:
        return vllm_style, "structured_outputs"
    return openai_style, "response_format"


async def check_constraint(prepared: PreparedRequest) -> None:
    """Whether the request's constraint compiles, decided off the event loop (a large schema
    takes a fraction of a second); a 400 naming the field it came from if it does not."""
    constraint = prepared.settings.structured_output
    if constraint is None:
        return
    problem = await asyncio.to_thread(constraint_error, *constraint)
    if problem is not None:
        field = prepared.constraint_field
        raise InvalidRequest(f"{field}: {problem}", param=field)


def _logit_bias(bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's `{"token id": bias}` (JSON keys are strings) as the engine's sorted pairs."""
    pairs = []
    for key, value in (bias or {}).items():
        if not (key.isascii() and key.isdecimal()):
            raise InvalidRequest(
                f"logit_bias keys must be token ids written as decimal integers, got {key!r}",
                param="logit_bias",
            )
        pairs.append((int(key), float(value)))
    if len({token for token, _ in pairs}) < len(pairs):  # "5" and "05"
        raise InvalidRequest("logit_bias names a token id twice", param="logit_bias")
    return tuple(sorted(pairs))


def sampling_for(
    fields: SamplingFields,
    max_tokens: int,
    logprobs: int | None,
    model: ServedModel,
    prompt_logprobs: int | None = None,
    structured_output: tuple[str, str] | None = None,
    structured_output_after: int | None = None,
) -> Sampling:
    if not 1 <= fields.n <= MAX_N:
        raise InvalidRequest(f"n must be between 1 and {MAX_N}", param="n")
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        raise InvalidRequest(f"logprobs must be between 0 and {MAX_LOGPROBS}", param="logprobs")
    stop = (fields.stop,) if isinstance(fields.stop, str) else tuple(fields.stop or ())
    if len(stop) > 4 or any(not s for s in stop):
        raise InvalidRequest("stop takes up to 4 non-empty strings", param="stop")
    sampling = Sampling(
        n=fields.n,
        max_tokens=max_tokens,
        min_tokens=fields.min_tokens or 0,
        temperature=1.0 if fields.temperature is None else fields.temperature,
        top_p=1.0 if fields.top_p is None else fields.top_p,
        top_k=0 if fields.top_k in (None, -1) else fields.top_k,  # vLLM's -1: off, as 0
        min_p=fields.min_p or 0.0,
        repetition_penalty=fields.repetition_penalty or 1.0,
        presence_penalty=fields.presence_penalty or 0.0,
        frequency_penalty=fields.frequency_penalty or 0.0,
        seed=fields.seed,
        stop=stop,
        ignore_eos=fields.ignore_eos,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        logit_bias=_logit_bias(fields.logit_bias),
        structured_output=structured_output,
        structured_output_after=structured_output_after,
    )
    return check_sampling(sampling, model)


def check_sampling(sampling: Sampling, model: ServedModel) -> Sampling:
    """The engine's own checks of the settings, run here: a clean 400 before dispatch."""
    try:
        sampling.to_params().validate(vocab_size=model.tokenizer.vocab_size)
    except InvalidRequestError as exc:
        raise InvalidRequest(exc.message, param=exc.param) from exc
    return sampling


def check_context(
    prompt_len: int, max_tokens: int, model: ServedModel, prompt_field: str = "messages"
) -> None:
    if prompt_len >= model.max_model_len:
        raise Unprocessable(
            f"the prompt has {prompt_len} tokens; this model's context is {model.max_model_len}",
            param=prompt_field,
            code="context_length_exceeded",
        )
    if prompt_len + max_tokens > model.max_model_len:
        raise InvalidRequest(
            f"max_tokens {max_tokens} + prompt {prompt_len} tokens exceeds this model's "
            f"context of {model.max_model_len} tokens",
            param="max_tokens",
            code="context_length_exceeded",
        )


def max_tokens_for(value: int | None, default: int, prompt_len: int, model: ServedModel) -> int:
    if value is None:
        return max(1, min(default, model.max_model_len - prompt_len))
    if value < 1:
        raise InvalidRequest("max_tokens must be at least 1", param="max_tokens")
    return value
