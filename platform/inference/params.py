"""From an OpenAI request to what the engine runs: prompt token ids and sampling settings.

Every check that can be made before the engine sees the request is made
here, with the OpenAI parameter named in the error, so bad input never costs
engine work and never reaches it as a 500.
"""

from __future__ import annotations

from dataclasses import dataclass

from hydrant.engine.errors import InvalidRequestError
from hydrant.engine.protocol import Sampling
from hydrant.engine.sampling_params import MAX_LOGPROBS
from hydrant.platform.errors import InvalidRequest, Unprocessable
from hydrant.platform.inference.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    SamplingFields,
)
from hydrant.platform.models.registry import ServedModel

MAX_N = 16
# A batched `/v1/completions` request runs one engine request per prompt; these bound what one
# HTTP request may hold (lm-evaluation-harness sends its `batch_size` prompts at once).
MAX_PROMPTS = 128
MAX_CHOICES = 256
ROLES = frozenset({"system", "user", "assistant", "developer", "tool"})


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


def _message_text(message: ChatMessage, index: int) -> str:
    if message.role not in ROLES:
        raise InvalidRequest(
            f"messages[{index}].role must be one of {', '.join(sorted(ROLES))}",
            param=f"messages[{index}].role",
        )
    if message.content is None:
        return ""
    if isinstance(message.content, str):
        return message.content
    parts = []
    for part in message.content:
        if part.type != "text" or part.text is None:
            raise InvalidRequest(
                f"messages[{index}].content: only text parts are supported, got {part.type!r}",
                param=f"messages[{index}].content",
            )
        parts.append(part.text)
    return "".join(parts)


def chat_prompt(request: ChatCompletionRequest, model: ServedModel) -> list[int]:
    if not request.messages:
        raise InvalidRequest("messages must contain at least one message", param="messages")
    if request.tools:
        raise InvalidRequest("tools are not supported by this server", param="tools")
    if request.response_format and request.response_format.get("type") not in (None, "text"):
        raise InvalidRequest(
            "only response_format type 'text' is supported", param="response_format"
        )
    conversation = [
        {"role": m.role, "content": _message_text(m, i)} for i, m in enumerate(request.messages)
    ]
    try:
        return model.tokenizer.encode_chat(conversation)
    except InvalidRequestError as exc:
        raise InvalidRequest(exc.message, param=exc.param or "messages") from exc


def _prompt_list(prompt: str | list[str | int | list[int]]) -> list[str | list[int]]:
    """OpenAI's four prompt forms as a list of prompts: a string, token ids, or a list of
    either (a batch)."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise InvalidRequest("prompt must not be empty", param="prompt")
    if all(isinstance(p, int) for p in prompt):
        return [prompt]  # type: ignore[list-item]
    if all(isinstance(p, str) for p in prompt) or all(isinstance(p, list) for p in prompt):
        return prompt  # type: ignore[return-value]
    raise InvalidRequest(
        "prompt must be a string, a list of token ids, or a list of strings or of token-id "
        "lists; not a mix",
        param="prompt",
    )


def completion_prompts(request: CompletionRequest, model: ServedModel) -> list[list[int]]:
    """The token ids of each prompt of the request (one, or a batch of up to MAX_PROMPTS)."""
    prompts = _prompt_list(request.prompt)
    if len(prompts) > MAX_PROMPTS:
        raise InvalidRequest(
            f"a request takes at most {MAX_PROMPTS} prompts, got {len(prompts)}", param="prompt"
        )
    batched = len(prompts) > 1
    vocab = model.tokenizer.vocab_size
    result = []
    for index, prompt in enumerate(prompts):
        where = f"prompt[{index}]" if batched else "prompt"
        if isinstance(prompt, str):
            ids = model.tokenizer.encode(prompt) if prompt else []
        else:
            ids = prompt
        if not ids:
            raise InvalidRequest(f"{where} must not be empty", param="prompt")
        if any(not 0 <= t < vocab for t in ids):
            raise InvalidRequest(f"{where}: token ids must be in [0, {vocab})", param="prompt")
        result.append(ids)
    return result


def _sampling(
    fields: SamplingFields,
    max_tokens: int,
    logprobs: int | None,
    model: ServedModel,
    prompt_logprobs: int | None = None,
) -> Sampling:
    if not 1 <= fields.n <= MAX_N:
        raise InvalidRequest(f"n must be between 1 and {MAX_N}", param="n")
    if fields.logit_bias:
        raise InvalidRequest("logit_bias is not supported by this server", param="logit_bias")
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
        top_k=fields.top_k or 0,
        min_p=fields.min_p or 0.0,
        repetition_penalty=fields.repetition_penalty or 1.0,
        presence_penalty=fields.presence_penalty or 0.0,
        frequency_penalty=fields.frequency_penalty or 0.0,
        seed=fields.seed,
        stop=stop,
        ignore_eos=fields.ignore_eos,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
    )
    try:
        sampling.to_params().validate(vocab_size=model.tokenizer.vocab_size)
    except InvalidRequestError as exc:
        raise InvalidRequest(exc.message, param=exc.param) from exc
    return sampling


def _check_context(
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


def _max_tokens(value: int | None, default: int, prompt_len: int, model: ServedModel) -> int:
    if value is None:
        return max(1, min(default, model.max_model_len - prompt_len))
    if value < 1:
        raise InvalidRequest("max_tokens must be at least 1", param="max_tokens")
    return value


def prepare_chat(
    request: ChatCompletionRequest, model: ServedModel, default_max_tokens: int
) -> PreparedRequest:
    ids = chat_prompt(request, model)
    asked = request.max_completion_tokens if request.max_completion_tokens is not None else None
    asked = request.max_tokens if asked is None else asked
    max_tokens = _max_tokens(asked, default_max_tokens, len(ids), model)
    _check_context(len(ids), max_tokens, model)
    if request.top_logprobs is not None and not request.logprobs:
        raise InvalidRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
    logprobs = (request.top_logprobs or 0) if request.logprobs else None
    return PreparedRequest.single(
        ids,
        _sampling(request, max_tokens, logprobs, model),
        stream=request.stream,
        include_usage=bool(request.stream_options and request.stream_options.include_usage),
    )


def prepare_completion(
    request: CompletionRequest, model: ServedModel, default_max_tokens: int
) -> PreparedRequest:
    if request.suffix:
        raise InvalidRequest("suffix is not supported by this server", param="suffix")
    if request.best_of not in (None, request.n):
        raise InvalidRequest("best_of other than n is not supported", param="best_of")
    if request.logprobs is not None and request.logprobs > 5:
        raise InvalidRequest("logprobs must be between 0 and 5", param="logprobs")
    batch = completion_prompts(request, model)
    if len(batch) * request.n > MAX_CHOICES:
        raise InvalidRequest(
            f"{len(batch)} prompts with n={request.n} make {len(batch) * request.n} choices; "
            f"a request returns at most {MAX_CHOICES}",
            param="n",
        )
    scoring = request.echo and request.logprobs is not None
    # with echo, the prompt is scored too
    prompt_logprobs = request.logprobs if scoring else None
    prompts = []
    for ids in batch:
        if scoring and request.max_tokens == 0:  # the prompt's logprobs alone, nothing generated
            max_tokens = 0
        else:
            max_tokens = _max_tokens(request.max_tokens, default_max_tokens, len(ids), model)
        _check_context(len(ids), max_tokens, model, "prompt")
        sampling = _sampling(request, max_tokens, request.logprobs, model, prompt_logprobs)
        echo = model.tokenizer.decode(ids) if request.echo else None
        prompts.append(PreparedPrompt(ids, sampling, echo))
    return PreparedRequest(
        tuple(prompts),
        stream=request.stream,
        include_usage=bool(request.stream_options and request.stream_options.include_usage),
        prompt_field="prompt",
    )
