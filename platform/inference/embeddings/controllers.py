"""Routes: OpenAI's `POST /v1/embeddings`, and vLLM's score and rerank on every path vLLM
serves them on (under `/v1`, at the root, and Cohere's `/v2/rerank`)."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, post
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec

from hydrant.platform.auth.principal import Principal
from hydrant.platform.http.openapi import raw_json_body_operation
from hydrant.platform.inference.deps import InferenceApi
from hydrant.platform.inference.embeddings.embedding import (
    ENCODINGS,
    EmbeddingList,
    EmbeddingRequest,
    embedding_list,
    prepare_embedding,
)
from hydrant.platform.inference.embeddings.scoring import (
    RerankRequest,
    ScoreRequest,
    prepare_rerank,
    prepare_score,
    rerank_results,
    score_list,
)
from hydrant.platform.inference.serving import Endpoint, serve

EMBEDDINGS = Endpoint(EmbeddingRequest, prepare_embedding, embedding_list)  # never streamed
SCORE = Endpoint(ScoreRequest, prepare_score, score_list)
RERANK = Endpoint(RerankRequest, prepare_rerank, rerank_results)


def _document_embedding_rules(schema: dict[str, Any]) -> None:
    """What `prepare_embedding` checks: the encodings, and a positive size."""
    properties = schema["properties"]
    properties["encoding_format"]["enum"] = list(ENCODINGS)
    for variant in properties["dimensions"].get("anyOf", []):
        if variant.get("type") == "integer":
            variant["minimum"] = 1


class EmbeddingsController(Controller):
    path = "/v1"

    @post(
        "/embeddings",
        status_code=200,
        operation_class=raw_json_body_operation(
            EmbeddingRequest, streams=False, refine=_document_embedding_rules
        ),
        responses={200: ResponseSpec(EmbeddingList, description="One vector per input")},
    )
    async def embeddings(
        self,
        request: Request[Any, Any, Any],
        inference: NamedDependency[InferenceApi],
        principal: NamedDependency[Principal],
    ) -> Any:
        """OpenAI's embeddings (embedding.py): pooled as the checkpoint declares (the last
        token's state unless it says otherwise), normalized."""
        return await serve(request, inference, principal, EMBEDDINGS)


class ScoringController(Controller):
    """Score and rerank (scoring.py), on every path vLLM serves them on: under `/v1`, at
    the root, and Cohere's `/v2/rerank` (where a Cohere client pointed at Hydrant posts)."""

    path = "/"

    @post(
        ["/v1/score", "/score"],
        status_code=200,
        operation_class=raw_json_body_operation(ScoreRequest, streams=False),
        responses={200: ResponseSpec(dict[str, Any], description="One score per pair")},
    )
    async def score(
        self,
        request: Request[Any, Any, Any],
        inference: NamedDependency[InferenceApi],
        principal: NamedDependency[Principal],
    ) -> Any:
        """vLLM's score: the cosine similarity of each pair's embeddings."""
        return await serve(request, inference, principal, SCORE)

    @post(
        ["/v1/rerank", "/rerank", "/v2/rerank"],
        status_code=200,
        operation_class=raw_json_body_operation(RerankRequest, streams=False),
        responses={200: ResponseSpec(dict[str, Any], description="Documents by relevance")},
    )
    async def rerank(
        self,
        request: Request[Any, Any, Any],
        inference: NamedDependency[InferenceApi],
        principal: NamedDependency[Principal],
    ) -> Any:
        """Jina's and Cohere's rerank, as vLLM serves it: documents ordered by the cosine
        similarity of their embedding to the query's."""
        return await serve(request, inference, principal, RERANK)
