"""The Files API's shapes, as OpenAI writes them (the official client parses these)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from litestar.datastructures import UploadFile
from msgspec import Struct

from hydrant.platform.db.batch_models import StoredFile


@dataclass
class FileUpload:
    """The multipart form of `POST /v1/files`: the file, and what it is for."""

    file: UploadFile
    purpose: str


class FileObject(Struct, kw_only=True):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    expires_at: int | None
    filename: str
    purpose: str
    status: Literal["processed"] = "processed"
    status_details: str | None = None

    @classmethod
    def of(cls, row: StoredFile) -> FileObject:
        return cls(
            id=row.id,
            bytes=row.bytes,
            created_at=int(row.created_at.timestamp()),
            expires_at=int(row.expires_at.timestamp()),
            filename=row.filename,
            purpose=row.purpose,
        )


class FileList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool

    @classmethod
    def of(cls, rows: list[StoredFile], has_more: bool) -> FileList:
        data = [FileObject.of(row) for row in rows]
        return cls(
            data=data,
            first_id=data[0].id if data else None,
            last_id=data[-1].id if data else None,
            has_more=has_more,
        )


class FileDeleted(Struct, kw_only=True):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True
