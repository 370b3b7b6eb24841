"""The file store on the embedded SQLite and on PostgreSQL: a tenant's files only, sealed at
rest in the database or on a volume, limits refused up front, expiry (never read; the
periodic job deletes), and another server secret reads as absent but can still delete."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import delete, func, select, update

from hydrant.platform.db.base import utcnow
from hydrant.platform.db.models import FileBlob, StoredFile, Tenant
from hydrant.platform.db.session import Database
from hydrant.platform.errors import (
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    ServiceUnavailable,
)
from hydrant.platform.files.deps import build_file_store
from hydrant.platform.files.service import FileStore
from hydrant.platform.files.tasks import PURGE_FILES
from hydrant.platform.job_table import JOB_TABLE, PERIODIC
from hydrant.platform.jobs.context import JobContext
from hydrant.settings import load_settings

SECRET = b"s" * 32
LINE = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
CONTENT = LINE * 3


def _store(
    database: Database, tmp_path: Path, secret: bytes = SECRET, **settings: object
) -> FileStore:
    config = load_settings({}, data_dir=tmp_path, **settings)
    return build_file_store(config, database, lambda: secret)


@pytest.fixture()
async def tenants(db: Database) -> Database:
    async with db.session() as session:
        session.add_all([Tenant(id="ten_a", name="a"), Tenant(id="ten_b", name="b")])
    return db


async def test_a_tenants_files_are_its_own(tenants: Database, tmp_path: Path) -> None:
    store = _store(tenants, tmp_path)
    row = await store.upload("ten_a", filename="in.jsonl", purpose="batch", content=CONTENT)
    assert row.id.startswith("file-") and row.bytes == len(CONTENT) and row.lines == 3
    assert await store.content("ten_a", row.id) == CONTENT
    for other in ("ten_b", None):  # another tenant, or a key of no tenant: as if absent
        for read in (store.get, store.content, store.delete):
            with pytest.raises(NotFound):
                await read(other, row.id)
        assert (await store.page(other))[0] == []
    page, more = await store.page("ten_a")
    assert [f.id for f in page] == [row.id] and not more
    await store.delete("ten_a", row.id)
    with pytest.raises(NotFound):
        await store.get("ten_a", row.id)
    with pytest.raises(PermissionDenied):
        await store.upload(None, filename="x", purpose="batch", content=CONTENT)


async def test_the_database_holds_the_content_sealed(tenants: Database, tmp_path: Path) -> None:
    store = _store(tenants, tmp_path)
    row = await store.upload("ten_a", filename="in.jsonl", purpose="batch", content=CONTENT)
    async with tenants.session() as session:
        blob = await session.scalar(select(FileBlob.sealed).where(FileBlob.file_id == row.id))
    assert blob is not None and b"custom_id" not in blob and len(blob) > len(CONTENT)
    # moved onto another row (or read with another secret), it does not open: absent
    other = await store.upload("ten_a", filename="b.jsonl", purpose="batch", content=LINE)
    async with tenants.session() as session:
        await session.execute(
            update(FileBlob).where(FileBlob.file_id == other.id).values(sealed=blob)
        )
    with pytest.raises(NotFound):
        await store.content("ten_a", other.id)
    rotated = _store(tenants, tmp_path, secret=b"t" * 32)
    with pytest.raises(NotFound):
        await rotated.content("ten_a", row.id)
    await rotated.delete("ten_a", row.id)  # deleting needs no opening
    async with tenants.session() as session:
        assert await session.scalar(select(func.count()).select_from(FileBlob)) == 1


async def test_a_volume_keeps_the_content_sealed_and_the_rows_in_the_database(
    tenants: Database, tmp_path: Path
) -> None:
    volume = tmp_path / "files"
    store = _store(tenants, tmp_path, files_dir=volume)
    row = await store.upload("ten_a", filename="in.jsonl", purpose="batch", content=CONTENT)
    path = volume / "ten_a" / row.id
    assert row.storage == "volume" and path.is_file()
    assert b"custom_id" not in path.read_bytes()
    assert await store.content("ten_a", row.id) == CONTENT
    async with tenants.session() as session:
        assert await session.scalar(select(func.count()).select_from(FileBlob)) == 0
    await store.delete("ten_a", row.id)
    assert not path.exists()
    assert list((volume / "ten_a").iterdir()) == []  # no temporary file left either


async def test_uploads_that_cannot_be_a_batch_are_refused(
    tenants: Database, tmp_path: Path
) -> None:
    store = _store(tenants, tmp_path, files_max_bytes=len(CONTENT), files_max_lines=3)
    with pytest.raises(PayloadTooLarge):
        await store.upload("ten_a", filename="x", purpose="batch", content=CONTENT + b"x")
    with pytest.raises(InvalidRequest, match="at most 3"):
        await store.upload("ten_a", filename="x", purpose="batch", content=b"{}\n" * 4)
    with pytest.raises(InvalidRequest, match="UTF-8"):
        await store.upload("ten_a", filename="x", purpose="batch", content=b"\xff\xfe\n")
    with pytest.raises(InvalidRequest, match="empty"):
        await store.upload("ten_a", filename="x", purpose="batch", content=b"\n \n")
    with pytest.raises(InvalidRequest) as purpose:
        await store.upload("ten_a", filename="x", purpose="fine-tune", content=CONTENT)
    assert purpose.value.param == "purpose"
    # blank lines and the last newline are not lines
    row = await store.upload("ten_a", filename="x", purpose="batch", content=b"{}\n\n{}\n{}")
    assert row.lines == 3


async def test_pages_go_newest_first_with_a_cursor(tenants: Database, tmp_path: Path) -> None:
    store = _store(tenants, tmp_path)
    ids = [
        (await store.upload("ten_a", filename=f"{i}", purpose="batch", content=LINE)).id
        for i in range(5)
    ]
    first, more = await store.page("ten_a", limit=2)
    assert [f.id for f in first] == ids[:-3:-1] and more
    rest, more = await store.page("ten_a", limit=10, after=first[-1].id)
    assert [f.id for f in rest] == ids[2::-1] and not more
    ascending, _ = await store.page("ten_a", order="asc", limit=10)
    assert [f.id for f in ascending] == ids
    assert (await store.page("ten_a", purpose="batch_output"))[0] == []
    with pytest.raises(InvalidRequest):
        await store.page("ten_b", after=ids[0])  # another tenant's id is no cursor


async def test_expired_files_are_never_read_and_the_purge_job_deletes_them(
    tenants: Database, tmp_path: Path
) -> None:
    volume = tmp_path / "files"
    store = _store(tenants, tmp_path, files_dir=volume)
    old = await store.upload("ten_a", filename="old", purpose="batch", content=LINE)
    new = await store.upload("ten_a", filename="new", purpose="batch", content=LINE)
    async with tenants.session() as session:
        await session.execute(
            update(StoredFile)
            .where(StoredFile.id == old.id)
            .values(expires_at=utcnow() - timedelta(seconds=1))
        )
    with pytest.raises(NotFound):
        await store.content("ten_a", old.id)
    assert [f.id for f in (await store.page("ten_a"))[0]] == [new.id]
    assert "hydrant.files.purge" in {p.job for p in PERIODIC}
    settings = load_settings({}, data_dir=tmp_path, files_dir=volume)
    ctx = JobContext(settings, tenants, mailer=None, enqueue=lambda *_: None)  # type: ignore[arg-type]
    ctx.__dict__["server_secret"] = SECRET  # the cached property, as the job would read it
    assert await JOB_TABLE.job_named(PURGE_FILES).fn(ctx) == {"deleted": 1, "orphans_removed": 0}
    assert not (volume / "ten_a" / old.id).exists()
    assert (volume / "ten_a" / new.id).exists()
    async with tenants.session() as session:
        assert set(await session.scalars(select(StoredFile.id))) == {new.id}


async def test_the_purge_job_sweeps_volume_blobs_no_row_names_once_past_the_grace(
    tenants: Database, tmp_path: Path
) -> None:
    """A gateway that died between writing a blob and committing its row, or between
    deleting a row and its blob, or mid-write: the blob goes once it is an hour old; a
    young one (its row may be on its way) and every blob with a row stay."""
    volume = tmp_path / "files"
    store = _store(tenants, tmp_path, files_dir=volume)
    kept = await store.upload("ten_a", filename="kept", purpose="batch", content=LINE)
    deleted = await store.upload("ten_b", filename="gone", purpose="batch", content=LINE)
    async with tenants.session() as session:  # the row deleted, the blob never removed
        await session.execute(delete(StoredFile).where(StoredFile.id == deleted.id))
    crashed = volume / "ten_a" / "file-crashedbeforeitsrow"
    half_written = volume / "ten_b" / ".file-halfwritten.abcd1234"
    young = volume / "ten_a" / "file-rowonitsway"
    for path in (crashed, half_written, young):
        path.write_bytes(b"sealed")
    two_hours_ago = time.time() - 7200
    for path in (crashed, half_written, volume / "ten_a" / kept.id, volume / "ten_b" / deleted.id):
        os.utime(path, (two_hours_ago, two_hours_ago))

    settings = load_settings({}, data_dir=tmp_path, files_dir=volume)
    ctx = JobContext(settings, tenants, mailer=None, enqueue=lambda *_: None)  # type: ignore[arg-type]
    ctx.__dict__["server_secret"] = SECRET
    assert await JOB_TABLE.job_named(PURGE_FILES).fn(ctx) == {"deleted": 0, "orphans_removed": 3}
    left = {p.relative_to(volume).as_posix() for p in volume.rglob("*") if p.is_file()}
    assert left == {f"ten_a/{kept.id}", "ten_a/file-rowonitsway"}
    assert await store.content("ten_a", kept.id) == LINE
    later = utcnow() + timedelta(hours=2)  # the young one, still without a row, goes later
    assert await store.sweep_orphans(later) == 1
    assert await store.sweep_orphans(later) == 0


async def test_a_volume_write_whose_row_fails_leaves_neither_row_nor_blob(
    tenants: Database, tmp_path: Path
) -> None:
    """The blob is written first and removed when the row cannot be committed: a row never
    names a missing blob, and a failed save leaves nothing behind."""
    volume = tmp_path / "files"
    store = _store(tenants, tmp_path, files_dir=volume)
    with pytest.raises(ServiceUnavailable):  # no such tenant: the row's insert fails
        await store.upload("ten_gone", filename="x", purpose="batch", content=LINE)
    assert [p for p in volume.rglob("*") if p.is_file()] == []
