"""OpenAI's `POST /v1/embeddings`: each input is one engine request that generates nothing
and returns its prompt's embedding (engine: last-token pooling, normalized).

It runs on the generation path (admission, quotas, one ledger entry, input tokens
billed at the model's input price, no output tokens), so a tenant's embeddings and
completions share the same budget and cost report. `encoding_format: base64` is the
vector's little-endian float32 bytes, as OpenAI sends them (the official client asks
for it by default and decodes it itself).
"""

from __future__ import annotations

import base64
import struct
from typing import Literal

import msgspec

from hydrant.engine.protocol import Sampling
from hydrant.engine.tokenizer import Tokenizer
from hydrant.platform.errors import InvalidRequest, ServiceUnavailable, Unprocessable
from hydrant.platform.inference.params import (
    PreparedPrompt,
    PreparedRequest,
    check_sampling,
    prompt_token_lists,
    truncation,
)
from hydrant.platform.inference.service import Generation
from hydrant.platform.models.registry import ServedModel

MAX_INPUTS = 2048  # OpenAI's limit on inputs per request
ENCODINGS = ("float", "base64")


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    model: str
    input: str | list[str | int | list[int]]
    encoding_format: str = "float"
    dimensions: int | None = None
    user: str | None = None
    add_special_tokens: bool = True  # vLLM's
    truncate_prompt_tokens: int | None = None  # vLLM's: keep each input's last k tokens
    priority: int = 0  # Hydrant's (as on the other endpoints)


class Embedding(msgspec.Struct, kw_only=True):
    index: int
    embedding: list[float] | str
    object: Literal["embedding"] = "embedding"


class EmbeddingUsage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(msgspec.Struct, kw_only=True):
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
    object: Literal["list"] = "list"


def prepare_embedding(
    request: EmbeddingRequest, model: ServedModel, default_max_tokens: int
) -> PreparedRequest:
    """One prompt per input, each asking for its embedding alone. (`default_max_tokens`
    is the generation endpoints' and has no meaning here.)"""
    del default_max_tokens
    if request.encoding_format not in ENCODINGS:
        raise InvalidRequest(
            f"encoding_format must be float or base64, got {request.encoding_format!r}",
            param="encoding_format",
        )
    inputs = prompt_token_lists(
        request.input,
        model,
        field="input",
        limit=MAX_INPUTS,
        add_special_tokens=request.add_special_tokens,
        keep=truncation(request.truncate_prompt_tokens, model),
    )
    return PreparedRequest(
        embedding_prompts(inputs, model, "input", request.dimensions),
        stream=False,
        include_usage=False,
        prompt_field="input",
        response_fields={"encoding_format": request.encoding_format},
    )


def embedding_prompts(
    inputs: list[list[int]], model: ServedModel, field: str, dimensions: int | None = None
) -> tuple[PreparedPrompt, ...]:
    """One engine request per input, each asking for its vector alone; an input may fill
    the context (nothing is generated after it), not more."""
    sampling = check_sampling(
        Sampling(max_tokens=0, embed=True, embed_dimensions=dimensions), model
    )
    prompts = []
    for index, ids in enumerate(inputs):
        if len(ids) > model.max_model_len:
            where = f"{field}[{index}]" if len(inputs) > 1 else field
            raise Unprocessable(
                f"{where} has {len(ids)} tokens; this model's context is {model.max_model_len}",
                param=field,
                code="context_length_exceeded",
            )
        prompts.append(PreparedPrompt(ids, sampling))
    return tuple(prompts)


def _encoded(vector: list[float], encoding: str) -> list[float] | str:
    if encoding == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


async def embedding_vectors(generation: Generation) -> list[list[float]]:
    """Every prompt's vector, in prompt order, once all are computed; all or none."""
    vectors: list[list[float] | None] = [None] * len(generation.ctx.prepared.prompts)
    async for index, chunk in generation:
        if chunk.embedding is not None:
            vectors[index] = chunk.embedding
    done = [v for v in vectors if v is not None]
    if len(done) < len(vectors):  # an engine failed or stopped the request
        missing = vectors.index(None)
        raise ServiceUnavailable(f"the embedding of input[{missing}] was not computed")
    return done


async def embedding_list(generation: Generation, tokenizer: Tokenizer) -> EmbeddingList:
    """Every input's vector, in input order, once all are computed."""
    del tokenizer
    vectors = await embedding_vectors(generation)
    encoding = (generation.ctx.prepared.response_fields or {}).get("encoding_format", "float")
    usage = generation.usage()
    return EmbeddingList(
        data=[Embedding(index=i, embedding=_encoded(v, encoding)) for i, v in enumerate(vectors)],
        model=generation.ctx.public_model,
        usage=EmbeddingUsage(prompt_tokens=usage.prompt_tokens, total_tokens=usage.prompt_tokens),
    )
