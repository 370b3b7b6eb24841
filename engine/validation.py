"""Checks a request must pass before it reaches the scheduler, made once per request.

Everything here is read-only, so the async front can run it on the event
loop while a step runs in its thread, and raise the error to the caller of
`generate()` before anything was queued; the engine then queues the request
without checking it again (`LLMEngine.add_request(request, checked=True)`).
A structured-output constraint is compiled apart (`raise_if_invalid`, cached):
the async front runs it in a thread, and the engine's guide for the request
reuses it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hydrant.engine.config import ModelConfig
from hydrant.engine.errors import InvalidRequestError
from hydrant.engine.fairness import check_weight
from hydrant.engine.output_constraints import request_field
from hydrant.engine.sampling_params import SamplingParams
from hydrant.engine.sequence import Request


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


@dataclass(frozen=True)
class RequestValidator:
    """What a request must fit to be served by one engine's model."""

    vocab_size: int
    max_model_len: int
    has_tokenizer: bool
    embedding_sizes: EmbeddingSizes | None = None
    embedding_only: bool = False

    @classmethod
    def for_model(
        cls, model_config: ModelConfig, max_model_len: int, has_tokenizer: bool
    ) -> RequestValidator:
        return cls(
            vocab_size=model_config.vocab_size,
            max_model_len=max_model_len,
            has_tokenizer=has_tokenizer,
            embedding_sizes=EmbeddingSizes(
                model_config.hidden_size, model_config.matryoshka_dimensions
            ),
            embedding_only=model_config.embedding_only,
        )

    def check(self, request: Request) -> None:
        """Raise InvalidRequestError (with the OpenAI parameter at fault) for unservable input."""
        params = request.params
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("params must be a SamplingParams", None)
        vocab_size, max_model_len = self.vocab_size, self.max_model_len
        params.validate(vocab_size)
        prompt_token_ids = request.prompt_token_ids
        if len(prompt_token_ids) == 0:
            raise InvalidRequestError("the prompt is empty; at least one token is needed", "prompt")
        for token in prompt_token_ids:
            if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < vocab_size:
                raise InvalidRequestError(
                    f"the prompt holds token id {token!r}, outside the vocabulary "
                    f"[0, {vocab_size})",
                    "prompt",
                )
        prompt_len = len(prompt_token_ids)
        if self.embedding_only and not params.embed:
            raise InvalidRequestError(
                "this model serves embeddings only (its checkpoint is a bare decoder with no LM "
                "head): use /v1/embeddings",
                "model",
            )
        if params.embed:
            check_embedding(
                prompt_len, params.embed_dimensions, max_model_len, self.embedding_sizes
            )
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
        if params.stop and not self.has_tokenizer:
            raise InvalidRequestError("stop strings need a tokenizer; this model has none", "stop")
        if params.structured_output is not None and not self.has_tokenizer:
            field = request_field(params.structured_output[0])
            raise InvalidRequestError(f"{field} needs a tokenizer; this model has none", field)
        check_weight(request.tenant_weight)
