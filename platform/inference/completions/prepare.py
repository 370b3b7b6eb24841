"""From a legacy completion request to what the engine runs: one prompt or a batch of them
(token ids or text), echoed and scored when asked, each with its sampling settings."""

from __future__ import annotations

from hydrant.platform.errors import InvalidRequest
from hydrant.platform.inference.params import (
    PreparedPrompt,
    PreparedRequest,
    check_context,
    max_tokens_for,
    output_constraint,
    prompt_token_lists,
    sampling_for,
    truncation,
)
from hydrant.platform.inference.schemas import CompletionRequest
from hydrant.platform.models.registry import ServedModel

MAX_CHOICES = 256


def prepare_completion(
    request: CompletionRequest, model: ServedModel, default_max_tokens: int
) -> PreparedRequest:
    if request.suffix:
        raise InvalidRequest("suffix is not supported by this server", param="suffix")
    if request.best_of not in (None, request.n):
        raise InvalidRequest("best_of other than n is not supported", param="best_of")
    if request.logprobs is not None and request.logprobs > 5:
        raise InvalidRequest("logprobs must be between 0 and 5", param="logprobs")
    batch = prompt_token_lists(
        request.prompt, model, keep=truncation(request.truncate_prompt_tokens, model)
    )
    if len(batch) * request.n > MAX_CHOICES:
        raise InvalidRequest(
            f"{len(batch)} prompts with n={request.n} make {len(batch) * request.n} choices; "
            f"a request returns at most {MAX_CHOICES}",
            param="n",
        )
    constraint, field = output_constraint(request)
    scoring = request.echo and request.logprobs is not None
    # with echo, the prompt is scored too
    prompt_logprobs = request.logprobs if scoring else None
    prompts = []
    for ids in batch:
        if scoring and request.max_tokens == 0:  # the prompt's logprobs alone, nothing generated
            max_tokens = 0
        else:
            max_tokens = max_tokens_for(request.max_tokens, default_max_tokens, len(ids), model)
        check_context(len(ids), max_tokens, model, "prompt")
        sampling = sampling_for(
            request, max_tokens, request.logprobs, model, prompt_logprobs, constraint
        )
        echo = model.tokenizer.decode(ids) if request.echo else None
        prompts.append(PreparedPrompt(ids, sampling, echo))
    return PreparedRequest(
        tuple(prompts),
        stream=request.stream,
        include_usage=bool(request.stream_options and request.stream_options.include_usage),
        prompt_field="prompt",
        constraint_field=field,
        response_fields={
            "return_token_ids": request.return_token_ids,
            "tokens_as_ids": request.return_tokens_as_token_ids,
        },
    )
