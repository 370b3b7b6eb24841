"""Routes: OpenAI's Files API, `/v1/files` (upload, list, retrieve, content, delete)."""

from __future__ import annotations

from typing import Annotated, Literal

from litestar import Controller, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.enums import RequestEncodingType
from litestar.params import Body, FromPath, FromQuery

from hydrant.platform.auth.principal import Principal
from hydrant.platform.files.schemas import FileDeleted, FileList, FileObject, FileUpload
from hydrant.platform.files.service import FileStore

# Multipart framing around the file itself: the router's body limit is the file limit plus
# this, so a file of exactly `HYDRANT_FILES_MAX_BYTES` is never refused for its envelope.
MULTIPART_OVERHEAD_BYTES = 64 * 1024


class FilesController(Controller):
    path = "/v1/files"

    @post("/", status_code=200)
    async def upload_file(
        self,
        data: Annotated[FileUpload, Body(media_type=RequestEncodingType.MULTI_PART)],
        files: NamedDependency[FileStore],
        principal: NamedDependency[Principal],
    ) -> FileObject:
        """Upload a batch input (JSONL, `purpose=batch`); it is sealed at rest."""
        content = await data.file.read()
        row = await files.upload(
            principal.tenant_id,
            filename=data.file.filename,
            purpose=data.purpose,
            content=content,
        )
        return FileObject.of(row)

    @get("/")
    async def list_files(
        self,
        files: NamedDependency[FileStore],
        principal: NamedDependency[Principal],
        purpose: FromQuery[str | None] = None,
        limit: FromQuery[int] = 10_000,
        order: FromQuery[Literal["asc", "desc"]] = "desc",
        after: FromQuery[str | None] = None,
    ) -> FileList:
        """The tenant's files, OpenAI's cursor page (newest first unless `order` is asc)."""
        rows, more = await files.page(
            principal.tenant_id, purpose=purpose, limit=limit, order=order, after=after
        )
        return FileList.of(rows, more)

    @get("/{file_id:str}")
    async def retrieve_file(
        self,
        file_id: FromPath[str],
        files: NamedDependency[FileStore],
        principal: NamedDependency[Principal],
    ) -> FileObject:
        return FileObject.of(await files.get(principal.tenant_id, file_id))

    @get("/{file_id:str}/content", media_type="application/octet-stream")
    async def file_content(
        self,
        file_id: FromPath[str],
        files: NamedDependency[FileStore],
        principal: NamedDependency[Principal],
    ) -> Response[bytes]:
        content = await files.content(principal.tenant_id, file_id)
        return Response(content, media_type="application/octet-stream")

    @delete("/{file_id:str}", status_code=200)
    async def delete_file(
        self,
        file_id: FromPath[str],
        files: NamedDependency[FileStore],
        principal: NamedDependency[Principal],
    ) -> FileDeleted:
        await files.delete(principal.tenant_id, file_id)
        return FileDeleted(id=file_id)
