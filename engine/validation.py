"""Checks a request must pass before it reaches the scheduler.

Everything here is read-only, so the async front can run it on the event
loop while a step runs in its thread, and raise the error to the caller of
`generate()` before anything was queued.
"""

from __future__ import annotations

from collections.abc import Sequence

from hydrant.engine.errors import InvalidRequestError
from hydrant.engine.fairness import check_weight
from hydrant.engine.sampling_params import SamplingParams


def validate_request(
    prompt_token_ids: Sequence[int],
    params: SamplingParams,
    *,
    vocab_size: int,
    max_model_len: int,
    has_tokenizer: bool,
    tenant_weight: float,
) -> None:
    """Raise InvalidRequestError (with the OpenAI parameter at fault) for unservable input."""
    if not isinstance(params, SamplingParams):
        raise InvalidRequestError("params must be a SamplingParams", None)
    params.validate(vocab_size)
    if len(prompt_token_ids) == 0:
        raise InvalidRequestError("the prompt is empty; at least one token is needed", "prompt")
    for token in prompt_token_ids:
        if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < vocab_size:
            raise InvalidRequestError(
                f"the prompt holds token id {token!r}, outside the vocabulary [0, {vocab_size})",
                "prompt",
            )
    prompt_len = len(prompt_token_ids)
    if prompt_len >= max_model_len:
        raise InvalidRequestError(
            f"this model's maximum context length is {max_model_len} tokens, and the prompt "
            f"has {prompt_len} (at least one token must be left for the completion)",
            "prompt",
        )
    if prompt_len + params.max_tokens > max_model_len:
        raise InvalidRequestError(
            f"this model's maximum context length is {max_model_len} tokens; you requested "
            f"{prompt_len + params.max_tokens} ({prompt_len} in the prompt, "
            f"{params.max_tokens} for the completion)",
            "max_tokens",
        )
    if params.stop and not has_tokenizer:
        raise InvalidRequestError("stop strings need a tokenizer; this model has none", "stop")
    check_weight(tenant_weight)
