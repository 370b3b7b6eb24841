"""The Responses API's stored answers: OpenAI's `store` (on unless a request says
`"store": false`), for `previous_response_id`, `GET /v1/responses/{id}` (and its input
items) and `DELETE`.

A stored answer keeps the whole conversation it answered: the input items of every
earlier turn of its chain, then its own, then its output. A follow-up names it as
`previous_response_id` and sends only what is new; the chain's items (its
`instructions` excepted, as OpenAI does) come first. Answers are a tenant's alone
(another tenant's id is a 404, as if absent) and expire after
`HYDRANT_RESPONSES_STORE_DAYS` (0 stores nothing, and `previous_response_id` is then
refused); expired rows are never read, and an hourly job (`hydrant.responses.purge`,
on the gateway's loop or Celery beat) deletes them. What a stored answer holds is the
tenant's prompts: it is never logged, and it is sealed at rest (`seal.py`).
"""

from __future__ import annotations

import logging
import secrets
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.scoping import scope_to_tenant
from hydrant.platform.db.base import utcnow
from hydrant.platform.db.errors import DATABASE_UNAVAILABLE
from hydrant.platform.db.models import StoredResponse
from hydrant.platform.db.outage import session_or_unavailable
from hydrant.platform.db.session import Database
from hydrant.platform.errors import InvalidRequest, NotFound
from hydrant.platform.inference.responses.seal import ResponseSealer, UnreadableAnswer

log = logging.getLogger(__name__)


def _missing(response_id: str, param: str | None = None) -> NotFound:
    return NotFound(f"Response with id '{response_id}' not found.", param=param)


def input_items(value: str | list[Any]) -> list[Any]:
    """A request's `input` as OpenAI lists input items: each with an id, a message's text
    as a list of parts."""
    items: list[Any] = [{"role": "user", "content": value}] if isinstance(value, str) else value
    out: list[Any] = []
    for item in items:
        if isinstance(item, dict):
            message = item.get("type", "message") == "message"
            named: dict[str, Any] = {
                "id": f"{'msg' if message else 'item'}_{secrets.token_hex(12)}"
            }
            item = {**named, **item}
            if message:
                item["type"] = "message"
                if isinstance(item.get("content"), str):
                    kind = "output_text" if item.get("role") == "assistant" else "input_text"
                    item["content"] = [{"type": kind, "text": item["content"]}]
        out.append(item)
    return out


async def purge_expired(database: Database, now: datetime) -> int:
    """Delete every stored answer past its expiry; how many there were."""
    async with database.session() as session:
        result = await session.execute(
            delete(StoredResponse).where(StoredResponse.expires_at < now)
        )
    return int(getattr(result, "rowcount", 0) or 0)


@dataclass(frozen=True)
class StoredAnswer:
    """A stored answer as read back: opened, whether it was stored sealed or (from before
    migration 0005) plain."""

    input_items: list[Any]
    body: dict[str, Any]


class ResponseStore:
    def __init__(self, database: Database, days: int, sealer: ResponseSealer) -> None:
        self._database = database
        self._keep = timedelta(days=max(days, 0))
        self._sealer = sealer

    @property
    def enabled(self) -> bool:
        return self._keep > timedelta(0)

    def _reading(self) -> AbstractAsyncContextManager[AsyncSession]:
        """A session whose database outage is a 503 the client can retry, not a 500."""
        return session_or_unavailable(self._database, "stored responses")

    async def save(self, tenant_id: str, response: dict[str, Any], items: list[Any]) -> bool:
        """Keep an answer; False (logged, nothing else) when the database would not take it:
        the client still gets its answer, marked as not stored."""
        now = utcnow()
        sealed = self._sealer.seal(tenant_id, response["id"], {"input": items, "body": response})
        row = StoredResponse(
            id=response["id"],
            tenant_id=tenant_id,
            model=response["model"],
            sealed=sealed,
            created_at=now,
            expires_at=now + self._keep,
        )
        try:
            async with self._database.session() as session:
                session.add(row)
        except (SQLAlchemyError, *DATABASE_UNAVAILABLE) as exc:
            # The error's class only: its message quotes the row, which is the prompts.
            log.warning(
                "a response could not be stored",
                extra={
                    "event": "response_store_failed",
                    "response_id": response["id"],
                    "error": type(exc).__name__,
                },
            )
            return False
        return True

    async def get(
        self, tenant_id: str | None, response_id: str, param: str | None = None
    ) -> StoredAnswer:
        return self._open(await self._row(tenant_id, response_id, param), param)

    async def _row(
        self, tenant_id: str | None, response_id: str, param: str | None = None
    ) -> StoredResponse:
        """The tenant's unexpired row, still sealed."""
        if not self.enabled:
            raise _missing(response_id, param)
        statement = select(StoredResponse).where(
            StoredResponse.id == response_id, StoredResponse.expires_at >= utcnow()
        )
        async with self._reading() as session:
            row = await session.scalar(scope_to_tenant(statement, StoredResponse, tenant_id))
        if row is None:
            raise _missing(response_id, param)
        return row

    def _open(self, row: StoredResponse, param: str | None) -> StoredAnswer:
        if row.sealed is None:  # stored before sealing (migration 0005)
            return StoredAnswer(row.input_items or [], row.body or {})
        try:
            payload = self._sealer.open(row.tenant_id, row.id, row.sealed)
        except UnreadableAnswer as exc:
            # Sealed under another server secret (rotated) or damaged: absent to the
            # client, as it will be once it expires; the reason only (no content) is logged.
            log.warning(
                "a stored response could not be opened",
                extra={"event": "response_unreadable", "response_id": row.id, "error": str(exc)},
            )
            raise _missing(row.id, param) from None
        return StoredAnswer(payload["input"], payload["body"])

    async def delete(self, tenant_id: str | None, response_id: str) -> None:
        """Deleting needs no opening: a tenant can delete an answer sealed under an earlier
        server secret too."""
        row = await self._row(tenant_id, response_id)
        async with self._reading() as session:
            await session.execute(delete(StoredResponse).where(StoredResponse.id == row.id))

    async def history(self, tenant_id: str | None, response_id: str) -> list[Any]:
        """The conversation a follow-up of `response_id` continues: the chain's input items
        and that answer's output items (which read back as input: messages, calls)."""
        if not self.enabled:
            raise InvalidRequest(
                "this server stores no responses (HYDRANT_RESPONSES_STORE_DAYS is 0): send "
                "the whole conversation in input",
                param="previous_response_id",
            )
        answer = await self.get(tenant_id, response_id, param="previous_response_id")
        return [*answer.input_items, *answer.body.get("output", [])]
