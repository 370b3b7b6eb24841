"""vLLM's `POST /v1/score` and the Jina/Cohere-style `POST /v1/rerank`, for embedding
models: a pair's score is the cosine similarity of its two texts' embeddings.

That is what vLLM answers for an embedding model (a cross-encoder, which reads both texts
at once, is another kind of checkpoint, not served here). Both run on the embeddings path:
each distinct text is one engine request that generates nothing (last-token pooled,
normalized, so the cosine is a dot product), and the request is metered like an
embeddings request: one ledger entry, every text's tokens billed as input. A text that
several pairs share (the query of a rerank, `text_1` against a list) is embedded once.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from hydrant.engine.tokenizer import Tokenizer
from hydrant.platform.errors import InvalidRequest
from hydrant.platform.inference.embeddings.embedding import (
    MAX_INPUTS,
    embedding_prompts,
    embedding_vectors,
)
from hydrant.platform.inference.params import PreparedRequest, prompt_token_lists, truncation
from hydrant.platform.inference.service import Generation
from hydrant.platform.models.registry import ServedModel


class ScoreRequest(msgspec.Struct, kw_only=True):
    """vLLM's: `text_1` against each of `text_2`, or pairwise when both are lists."""

    model: str
    text_1: str | list[str]
    text_2: str | list[str]
    truncate_prompt_tokens: int | None = None
    user: str | None = None
    priority: int = 0


class RerankRequest(msgspec.Struct, kw_only=True):
    """Jina's and Cohere's shape, as vLLM takes it."""

    model: str
    query: str
    documents: list[str]
    top_n: int | None = None
    return_documents: bool = True
    truncate_prompt_tokens: int | None = None
    user: str | None = None
    priority: int = 0


def _texts(value: str | list[str], field: str) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not texts:
        raise InvalidRequest(f"{field} must hold at least one text", param=field)
    return texts


def _token_lists(
    texts: list[str], model: ServedModel, field: str, keep: int | None
) -> list[list[int]]:
    """Each text's tokens; errors name the field and, in a list of several, the index."""
    batch: list[str | int | list[int]] = list(texts)
    return prompt_token_lists(batch, model, field=field, limit=MAX_INPUTS, keep=keep)


def _prepared(
    ids: list[list[int]], fields: dict[str, Any], model: ServedModel, prompt_field: str
) -> PreparedRequest:
    """One embedding prompt per text, in order."""
    if len(ids) > MAX_INPUTS:
        raise InvalidRequest(
            f"a request embeds at most {MAX_INPUTS} texts, this one {len(ids)}",
            param=prompt_field,
        )
    return PreparedRequest(
        embedding_prompts(ids, model, prompt_field),
        stream=False,
        include_usage=False,
        prompt_field=prompt_field,
        response_fields=fields,
    )


def prepare_score(
    request: ScoreRequest, model: ServedModel, default_max_tokens: int
) -> PreparedRequest:
    del default_max_tokens  # nothing is generated
    keep = truncation(request.truncate_prompt_tokens, model)
    first, second = _texts(request.text_1, "text_1"), _texts(request.text_2, "text_2")
    if len(first) not in (1, len(second)):
        raise InvalidRequest(
            f"text_1 must be one text, or as many as text_2 ({len(second)}), got {len(first)}",
            param="text_1",
        )
    left = _token_lists(first, model, "text_1", keep)
    right = _token_lists(second, model, "text_2", keep)
    offset = len(left)
    pairs = [(0 if len(left) == 1 else i, offset + i) for i in range(len(right))]
    return _prepared(left + right, {"pairs": pairs}, model, "text_2")


def prepare_rerank(
    request: RerankRequest, model: ServedModel, default_max_tokens: int
) -> PreparedRequest:
    del default_max_tokens
    keep = truncation(request.truncate_prompt_tokens, model)
    if request.top_n is not None and request.top_n < 1:
        raise InvalidRequest("top_n must be at least 1", param="top_n")
    query = prompt_token_lists(request.query, model, field="query", keep=keep)
    documents = _token_lists(_texts(request.documents, "documents"), model, "documents", keep)
    fields = {
        "top_n": request.top_n,
        "documents": request.documents if request.return_documents else None,
    }
    return _prepared(query + documents, fields, model, "documents")


def _cosine(a: list[float], b: list[float]) -> float:
    """The engine's vectors are unit length: their cosine is their dot product."""
    return sum(x * y for x, y in zip(a, b, strict=True))


async def score_list(generation: Generation, tokenizer: Tokenizer) -> dict[str, Any]:
    """vLLM's ScoreResponse: one score per pair, in pair order."""
    del tokenizer
    vectors = await embedding_vectors(generation)
    pairs = (generation.ctx.prepared.response_fields or {})["pairs"]
    tokens = generation.usage().prompt_tokens
    return {
        "id": f"score-{generation.ctx.request_id}",
        "object": "list",
        "created": int(time.time()),
        "model": generation.ctx.public_model,
        "data": [
            {"index": i, "object": "score", "score": _cosine(vectors[a], vectors[b])}
            for i, (a, b) in enumerate(pairs)
        ],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


async def rerank_results(generation: Generation, tokenizer: Tokenizer) -> dict[str, Any]:
    """Jina's rerank answer: the documents by relevance, highest first, `top_n` of them;
    each keeps its index in the request (ties keep request order)."""
    del tokenizer
    query, *documents = await embedding_vectors(generation)
    fields = generation.ctx.prepared.response_fields or {}
    scores = [_cosine(query, document) for document in documents]
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[: fields.get("top_n")]
    texts = fields.get("documents")
    tokens = generation.usage().prompt_tokens
    return {
        "id": f"rerank-{generation.ctx.request_id}",
        "model": generation.ctx.public_model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "results": [
            {
                "index": i,
                "document": {"text": texts[i]} if texts is not None else None,
                "relevance_score": scores[i],
            }
            for i in order
        ],
    }
