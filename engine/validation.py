"""Checks a request must pass before it reaches the scheduler.

Everything here is read-only, so the async front can run it on the event
loop while a step runs in its thread, and raise the error to the caller of
`generate()` before anything was queued.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hydrant.engine.errors import InvalidRequestError
from hydrant.engine.fairness import check_weight
from hydrant.engine.output_constraints import request_field
from hydrant.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class EmbeddingSizes:
    """A model's embedding size and the smaller ones it may be cut to (ModelConfig's
    `matryoshka_dimensions`: None, none; (), any)."""

    hidden_size: int
    matryoshka: tuple[int, ...] | None = None


def check_embedding(
    prompt_len: int, dimensions: int | None, max_model_len: int, sizes: EmbeddingSizes | None
) -> None:
    """An embedding reads the whole prompt and writes nothing, so the prompt may fill the
    context; `dimensions` must be a size the model was trained to be cut to."""
    if prompt_len > max_model_len:
        raise InvalidRequestError(
            f"this model's maximum context length is {max_model_len} tokens, and the input "
            f"has {prompt_len}",
            "input",
        )
    if dimensions is None or sizes is None or dimensions == sizes.hidden_size:
        return
    if dimensions > sizes.hidden_size:
        raise InvalidRequestError(
            f"dimensions ({dimensions}) exceeds this model's embedding size ({sizes.hidden_size})",
            "dimensions",
        )
    if sizes.matryoshka is None:
        raise InvalidRequestError(
            f"this model's embeddings have {sizes.hidden_size} dimensions and it was not "
            "trained to be cut shorter (Matryoshka); leave dimensions out",
            "dimensions",
        )
    if sizes.matryoshka and dimensions not in sizes.matryoshka:
        listed = ", ".join(str(d) for d in sizes.matryoshka)
        raise InvalidRequestError(
            f"dimensions must be one of {listed} or {sizes.hidden_size} for this model",
            "dimensions",
        )


def validate_request(
    prompt_token_ids: Sequence[int],
    params: SamplingParams,
    *,
    vocab_size: int,
    max_model_len: int,
    has_tokenizer: bool,
    tenant_weight: float,
    embedding_sizes: EmbeddingSizes | None = None,
    embedding_only: bool = False,
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
    if embedding_only and not params.embed:
        raise InvalidRequestError(
            "this model serves embeddings only (its checkpoint is a bare decoder with no LM "
            "head): use /v1/embeddings",
            "model",
        )
    if params.embed:
        check_embedding(prompt_len, params.embed_dimensions, max_model_len, embedding_sizes)
    if prompt_len >= max_model_len and not params.embed:
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
    if params.structured_output is not None and not has_tokenizer:
        field = request_field(params.structured_output[0])
        raise InvalidRequestError(f"{field} needs a tokenizer; this model has none", field)
    check_weight(tenant_weight)
