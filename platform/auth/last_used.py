"""When each key was last used, written at most once a minute per key, off the request path.

Why not an UPDATE per request: a hot key would turn every inference call into
a write on one row (lock contention on PostgreSQL, a single writer on SQLite).
Requests only note the time in memory (`touch`, no I/O); a background loop
writes what is due in one short transaction. A crash loses at most the last
few seconds of "last used" times, which is an acceptable price for them.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

from sqlalchemy import or_, update

from hydrant.platform.db.models import ApiKey
from hydrant.platform.db.session import Database

log = logging.getLogger(__name__)


class LastUsedRecorder:
    def __init__(
        self,
        database: Database,
        *,
        every: timedelta = timedelta(minutes=1),
        flush_every_s: float = 10.0,
    ) -> None:
        self._database = database
        self._every = every
        self._flush_every_s = flush_every_s
        self._noted: dict[str, datetime] = {}  # key id -> last time taken for writing
        self._pending: dict[str, datetime] = {}

    @property
    def pending(self) -> dict[str, datetime]:
        return dict(self._pending)

    def touch(self, key_id: str, now: datetime) -> None:
        """Note a use; only the first use in each interval is queued for writing."""
        noted = self._noted.get(key_id)
        if noted is not None and now - noted < self._every:
            return
        self._noted[key_id] = now
        self._pending[key_id] = now

    async def flush(self) -> int:
        """Write the queued times; on a database error keep them for the next try."""
        if not self._pending:
            return 0
        batch, self._pending = self._pending, {}
        try:
            async with self._database.session() as session:
                for key_id, moment in batch.items():
                    await session.execute(
                        update(ApiKey)
                        .where(
                            ApiKey.id == key_id,
                            or_(ApiKey.last_used_at.is_(None), ApiKey.last_used_at < moment),
                        )
                        .values(last_used_at=moment)
                    )
        except Exception:
            for key_id, moment in batch.items():
                self._pending.setdefault(key_id, moment)
            raise
        self._forget_old(max(batch.values()))
        return len(batch)

    def _forget_old(self, now: datetime) -> None:
        # Keys not used for an interval need no memory: their next use is due anyway.
        stale = [k for k, t in self._noted.items() if now - t >= self._every]
        for key_id in stale:
            del self._noted[key_id]

    async def run(self) -> None:
        """Flush periodically until cancelled (the app's lifespan owns this task)."""
        while True:
            await asyncio.sleep(self._flush_every_s)
            try:
                await self.flush()
            except Exception as exc:  # the database may be down; the times wait in memory
                log.warning("could not record key last-used times: %s", type(exc).__name__)
