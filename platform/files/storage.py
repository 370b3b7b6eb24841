"""Where a file's sealed content lives: the database (default) or a volume directory.

Why a volume at all: a database holding a few hundred MB of batch inputs and outputs
per tenant bloats its backups and replication for data that is write-once and short
lived; `HYDRANT_FILES_DIR` (a volume every gateway and job worker mounts) keeps only
the rows in the database. Either way the bytes are sealed first (service.py), so the
volume holds nothing readable without the server secret.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.db.batch_models import FileBlob


class VolumeBlobs:
    """Sealed contents as files `<dir>/<tenant>/<file id>`, written atomically."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, tenant_id: str, file_id: str) -> Path:
        for part in (tenant_id, file_id):  # ids are ours, but a path is no place to trust
            if not part or "/" in part or part.startswith("."):
                raise ValueError(f"not an id: {part!r}")
        return self.directory / tenant_id / file_id

    async def put(self, tenant_id: str, file_id: str, sealed: bytes) -> None:
        await asyncio.to_thread(self._write, self.path(tenant_id, file_id), sealed)

    async def get(self, tenant_id: str, file_id: str) -> bytes | None:
        path = self.path(tenant_id, file_id)
        try:
            return await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError:
            return None

    async def remove(self, tenant_id: str, file_id: str) -> None:
        await asyncio.to_thread(self.path(tenant_id, file_id).unlink, missing_ok=True)

    def older_than(self, cutoff: float) -> list[tuple[str, str]]:
        """(tenant, name) of every blob on the volume last written before `cutoff` (epoch
        s), temporary files of a write that never finished (`.<id>.<hex>`) among them.
        Blocking: run it in a thread."""
        found: list[tuple[str, str]] = []
        if not self.directory.is_dir():
            return found
        for tenant in os.scandir(self.directory):
            if not tenant.is_dir(follow_symlinks=False):
                continue
            for entry in os.scandir(tenant.path):
                if not entry.is_file(follow_symlinks=False):
                    continue
                try:
                    if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                        found.append((tenant.name, entry.name))
                except FileNotFoundError:  # removed meanwhile
                    continue
        return found

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        """Whole or not at all: a temporary file, fsync'd, renamed over the final name."""
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)


async def put_row_blob(session: AsyncSession, file_id: str, sealed: bytes) -> None:
    session.add(FileBlob(file_id=file_id, sealed=sealed))


async def row_blob(session: AsyncSession, file_id: str) -> bytes | None:
    return await session.scalar(select(FileBlob.sealed).where(FileBlob.file_id == file_id))


async def remove_row_blob(session: AsyncSession, file_id: str) -> None:
    await session.execute(delete(FileBlob).where(FileBlob.file_id == file_id))
