"""The Files API's rules: what may be uploaded, who may read it, how long it is kept.

A file is its tenant's alone (another tenant's id answers 404, as if absent) and
holds the tenant's prompts or answers, so its content is sealed before it is stored
(`platform/sealing.py`, bound to its tenant and id) and never logged. Files expire
after `HYDRANT_FILES_RETENTION_DAYS`; an expired file is never read, and the hourly
`hydrant.files.purge` job deletes it, row and content.

Uploads are refused up front when they cannot become a batch: over
`HYDRANT_FILES_MAX_BYTES` (413), not UTF-8, empty, or more lines than
`HYDRANT_FILES_MAX_LINES` (400). Each line's request is checked when a batch is
created from the file, where an error can name its line.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.db.base import utcnow
from hydrant.platform.db.batch_models import StoredFile
from hydrant.platform.db.outage import session_or_unavailable
from hydrant.platform.db.pagination import MAX_PAGE
from hydrant.platform.db.session import Database
from hydrant.platform.errors import (
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    ServiceUnavailable,
)
from hydrant.platform.files import repository, storage
from hydrant.platform.sealing import Sealer, Unopenable

log = logging.getLogger(__name__)

UPLOAD_PURPOSES = ("batch",)
OUTPUT_PURPOSE = "batch_output"
MAX_FILENAME = 255
PURGE_BATCH = 500  # files deleted per transaction by the purge
# A volume blob with no row is removed once it is this old: younger, its row may still be
# on its way (a blob is written before its row is committed).
ORPHAN_GRACE = timedelta(hours=1)


@dataclass(frozen=True)
class FileLimits:
    max_bytes: int
    max_lines: int
    retention: timedelta


def count_lines(content: bytes) -> int:
    """Non-blank lines of a JSONL file (a trailing newline, or blank lines, are not lines)."""
    return sum(1 for line in content.splitlines() if line.strip())


def _missing(file_id: str) -> NotFound:
    return NotFound(f"No such File object: {file_id}", param="file_id")


def _tenant(tenant_id: str | None) -> str:
    if tenant_id is None:
        raise PermissionDenied("files belong to a tenant, and this key has none")
    return tenant_id


class FileStore:
    def __init__(
        self,
        database: Database,
        sealer: Sealer,
        limits: FileLimits,
        directory: Path | None = None,
    ) -> None:
        self._database = database
        self._sealer = sealer
        self.limits = limits
        self._volume = storage.VolumeBlobs(directory) if directory is not None else None

    def _session(self) -> AbstractAsyncContextManager[AsyncSession]:
        return session_or_unavailable(self._database, "files")

    async def upload(
        self, tenant_id: str | None, *, filename: str, purpose: str, content: bytes
    ) -> StoredFile:
        """A tenant's upload, checked to be a batch input that can be read line by line."""
        owner = _tenant(tenant_id)
        if purpose not in UPLOAD_PURPOSES:
            raise InvalidRequest(
                f"purpose {purpose!r} is not supported here: upload batch inputs with "
                "purpose 'batch'",
                param="purpose",
            )
        if len(content) > self.limits.max_bytes:
            raise PayloadTooLarge(
                f"the file is {len(content)} bytes; at most {self.limits.max_bytes} are accepted",
                param="file",
            )
        lines = await asyncio.to_thread(self._check_jsonl, content)
        return await self.save(
            owner, filename=filename, purpose=purpose, content=content, lines=lines
        )

    def _check_jsonl(self, content: bytes) -> int:
        try:
            content.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequest("the file is not UTF-8 text (JSONL)", param="file") from None
        lines = count_lines(content)
        if lines == 0:
            raise InvalidRequest(
                "the file is empty: a batch input has one request per line", param="file"
            )
        if lines > self.limits.max_lines:
            raise InvalidRequest(
                f"the file has {lines} lines; a batch input may have at most "
                f"{self.limits.max_lines}",
                param="file",
            )
        return lines

    async def save(
        self,
        tenant_id: str,
        *,
        filename: str,
        purpose: str,
        content: bytes,
        lines: int | None = None,
        expires_after: timedelta | None = None,
    ) -> StoredFile:
        """Store `content` sealed as a new file of the tenant (uploads and batch outputs).
        `expires_after`: its life from now (a batch's `output_expires_after`); None: the
        files' retention."""
        file_id = f"file-{secrets.token_hex(12)}"
        now = utcnow()
        row = StoredFile(
            id=file_id,
            tenant_id=tenant_id,
            purpose=purpose,
            filename=(filename or "file.jsonl")[:MAX_FILENAME],
            bytes=len(content),
            lines=count_lines(content) if lines is None else lines,
            storage="volume" if self._volume is not None else "database",
            created_at=now,
            expires_at=now + (expires_after or self.limits.retention),
        )
        sealed = await asyncio.to_thread(self._sealer.seal, content, tenant_id, file_id)
        if self._volume is not None:  # the content first: a row never points at nothing
            await self._volume.put(tenant_id, file_id, sealed)
        try:
            async with self._session() as session:
                session.add(row)
                if self._volume is None:
                    await session.flush()  # the row before the blob that references it
                    await storage.put_row_blob(session, file_id, sealed)
        except BaseException:
            if self._volume is not None:
                await self._volume.remove(tenant_id, file_id)
            raise
        return row

    async def get(self, tenant_id: str | None, file_id: str) -> StoredFile:
        async with self._session() as session:
            row = await repository.live_file(session, tenant_id, file_id, utcnow())
        if row is None:
            raise _missing(file_id)
        return row

    async def content(self, tenant_id: str | None, file_id: str) -> bytes:
        """The file's bytes as uploaded (or as the batch wrote them)."""
        row = await self.get(tenant_id, file_id)
        if row.storage == "volume":
            if self._volume is None:
                raise ServiceUnavailable(
                    "this file is kept on the files volume, which this server does not mount "
                    "(HYDRANT_FILES_DIR)"
                )
            sealed = await self._volume.get(row.tenant_id, row.id)
        else:
            async with self._session() as session:
                sealed = await storage.row_blob(session, row.id)
        if sealed is None:
            log.warning("a file's content is missing", extra={"file_id": row.id})
            raise _missing(file_id)
        try:
            return await asyncio.to_thread(self._sealer.open, sealed, row.tenant_id, row.id)
        except Unopenable as exc:
            # Sealed under another server secret (rotated) or damaged: absent to the client;
            # the reason only (no content) is logged. It can still be deleted.
            log.warning(
                "a file could not be opened",
                extra={"event": "file_unreadable", "file_id": row.id, "error": str(exc)},
            )
            raise _missing(file_id) from None

    async def page(
        self,
        tenant_id: str | None,
        *,
        purpose: str | None = None,
        limit: int = 10_000,
        order: str = "desc",
        after: str | None = None,
    ) -> tuple[list[StoredFile], bool]:
        """OpenAI's cursor page of a tenant's files, newest first unless `order` is asc.
        A limit above a page's size gives a full page and `has_more`, as a cursor page may."""
        if not 1 <= limit <= 10_000:
            raise InvalidRequest("limit must be between 1 and 10000", param="limit")
        if order not in ("asc", "desc"):
            raise InvalidRequest("order must be asc or desc", param="order")
        async with self._session() as session:
            rows, more = await repository.page_of_files(
                session,
                tenant_id,
                utcnow(),
                purpose=purpose,
                limit=min(limit, MAX_PAGE),
                after=after,
                descending=order == "desc",
            )
        return list(rows), more

    async def delete(self, tenant_id: str | None, file_id: str) -> None:
        """Deleting needs no opening: a file sealed under an earlier server secret goes too."""
        row = await self.get(tenant_id, file_id)
        async with self._session() as session:
            await repository.delete_files(session, [row.id])
        if row.storage == "volume" and self._volume is not None:
            await self._volume.remove(row.tenant_id, row.id)

    async def purge_expired(self, now: datetime) -> int:
        """Delete every file past its expiry, row and content; how many there were."""
        deleted = 0
        while True:
            async with self._database.session() as session:
                expired = await repository.expired_files(session, now, PURGE_BATCH)
                if not expired:
                    return deleted
                await repository.delete_files(session, [file_id for file_id, _, _ in expired])
            if self._volume is not None:
                for file_id, tenant_id, kind in expired:
                    if kind == "volume":
                        await self._volume.remove(tenant_id, file_id)
            deleted += len(expired)

    async def sweep_orphans(self, now: datetime, grace: timedelta = ORPHAN_GRACE) -> int:
        """Remove the volume's blobs that no row names, written more than `grace` ago: a
        gateway that died between writing a blob and committing its row, or between
        deleting a row and its blob (the order of both: a row never names a missing blob),
        and temporary files of writes cut short. How many went."""
        if self._volume is None:
            return 0
        volume = self._volume
        found = await asyncio.to_thread(volume.older_than, (now - grace).timestamp())
        removed = 0
        for start in range(0, len(found), PURGE_BATCH):
            chunk = found[start : start + PURGE_BATCH]
            async with self._database.session() as session:
                named = await repository.existing_ids(session, [name for _, name in chunk])
            for tenant_id, name in chunk:
                if name in named:
                    continue
                await asyncio.to_thread((volume.directory / tenant_id / name).unlink, True)
                removed += 1
            log.info(
                "files volume swept",
                extra={"checked": start + len(chunk), "of": len(found), "removed": removed},
            )
        return removed
