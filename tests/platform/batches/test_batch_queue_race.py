"""Concurrent `POST /v1/batches` of one tenant against its plan's batch queue limit
(OpenAI's enqueued-token limit): the check and the insert are one atomic step, so the
tokens enqueued never pass the limit; the losers get OpenAI's error object."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
from batch_helpers import Gateway, chat_line, gateway, jsonl
from sqlalchemy import select

from hydrant.platform.auth.principal import INFERENCE_SCOPE
from hydrant.platform.batches.schemas import BatchCreate
from hydrant.platform.db.models import Batch
from hydrant.platform.errors import RateLimited

CONTENT = jsonl([chat_line(f"q{i}", f"tell me about the number {i}") for i in range(4)])
RACERS = 6


def _body(file_id: str) -> BatchCreate:
    return BatchCreate(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )


async def _enqueued(gw: Gateway, tenant_id: str) -> list[int]:
    async def read() -> list[int]:
        async with gw.services.database.session() as session:
            rows = await session.scalars(
                select(Batch.enqueued_tokens).where(Batch.tenant_id == tenant_id)
            )
            return list(rows.all())

    return await asyncio.to_thread(gw.client.blocking_portal.call, read)


async def test_concurrent_creates_never_enqueue_past_the_limit(
    empty_database_url: str, data_dir: Path, demo_model_dir: Path
) -> None:
    # No job loop: the batches stay queued (a running one frees its tokens line by line).
    settings = {"database_url": empty_database_url, "embedded_jobs": False}
    async with gateway(data_dir, demo_model_dir, **settings) as gw:
        probe_tenant, probe = await gw.tenant("probe")
        assert (await gw.create(probe, CONTENT)).status_code == 200
        (tokens,) = await _enqueued(gw, probe_tenant)  # one batch's prompt tokens
        limit = 2 * tokens + tokens // 2  # room for two of the racers, not three
        tenant_id, key = await gw.tenant("acme", plan={"batch_queue_tokens": limit})
        file_ids = [await gw.upload(key, CONTENT) for _ in range(RACERS)]

        async def race() -> list[Any]:
            # Straight to the service on the gateway's loop: every create is in flight at
            # once (the test client would send them one after another).
            principal = await gw.services.authenticator.authenticate(
                f"Bearer {key}", INFERENCE_SCOPE
            )
            service = gw.services.inference.batches
            return await asyncio.gather(
                *(service.create(principal, _body(file_id)) for file_id in file_ids),
                return_exceptions=True,
            )

        answers = await asyncio.to_thread(gw.client.blocking_portal.call, race)
        made = [a for a in answers if isinstance(a, Batch)]
        refused = [a for a in answers if not isinstance(a, Batch)]
        assert len(made) == 2 and len(refused) == RACERS - 2, refused
        assert all(isinstance(a, RateLimited) for a in refused), refused
        assert {a.code for a in refused} == {"token_limit_exceeded"}
        # What a loser answers over HTTP: OpenAI's error object, a 429 with Retry-After.
        answer = await gw.client.post(
            "/v1/batches", json=msgspec.to_builtins(_body(file_ids[0])), headers=gw.auth(key)
        )
        assert answer.status_code == 429 and answer.headers["retry-after"]
        error = answer.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert (error["type"], error["code"]) == ("rate_limit_error", "token_limit_exceeded")
        enqueued = await _enqueued(gw, tenant_id)
        assert len(enqueued) == 2 and sum(enqueued) <= limit
