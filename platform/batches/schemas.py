"""The Batch API's shapes, as OpenAI writes them (the official client parses these)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from hydrant.platform.db.batch_models import Batch

MetadataKey = Annotated[str, Meta(max_length=64)]
MetadataValue = Annotated[str, Meta(max_length=512)]


class BatchCreate(Struct, kw_only=True):
    input_file_id: Annotated[str, Meta(min_length=1, max_length=64)]
    endpoint: str
    completion_window: str
    metadata: Annotated[dict[MetadataKey, MetadataValue], Meta(max_length=16)] | None = None
    output_expires_after: dict[str, Any] | None = None  # checked by the service


class BatchError(Struct, kw_only=True):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[BatchError]


class RequestCounts(Struct, kw_only=True):
    total: int
    completed: int
    failed: int


class InputTokensDetails(Struct, kw_only=True):
    cached_tokens: int


class OutputTokensDetails(Struct, kw_only=True):
    reasoning_tokens: int = 0


class BatchUsage(Struct, kw_only=True):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


def _epoch(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp())


class BatchObject(Struct, kw_only=True):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    model: str
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: str
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    usage: BatchUsage
    metadata: dict[str, str] | None

    @classmethod
    def of(cls, row: Batch) -> BatchObject:
        errors = None
        if row.errors:
            errors = BatchErrors(data=[BatchError(**e) for e in row.errors])
        return cls(
            id=row.id,
            endpoint=row.endpoint,
            model=row.model,
            errors=errors,
            input_file_id=row.input_file_id,
            completion_window=row.completion_window,
            status=row.status,
            output_file_id=row.output_file_id,
            error_file_id=row.error_file_id,
            created_at=int(row.created_at.timestamp()),
            in_progress_at=_epoch(row.in_progress_at),
            expires_at=_epoch(row.expires_at),
            finalizing_at=_epoch(row.finalizing_at),
            completed_at=_epoch(row.completed_at),
            failed_at=_epoch(row.failed_at),
            expired_at=_epoch(row.expired_at),
            cancelling_at=_epoch(row.cancelling_at),
            cancelled_at=_epoch(row.cancelled_at),
            request_counts=RequestCounts(
                total=row.request_total,
                completed=row.request_completed,
                failed=row.request_failed,
            ),
            usage=BatchUsage(
                input_tokens=row.input_tokens,
                input_tokens_details=InputTokensDetails(cached_tokens=row.cached_tokens),
                output_tokens=row.output_tokens,
                output_tokens_details=OutputTokensDetails(),
                total_tokens=row.input_tokens + row.output_tokens,
            ),
            metadata=row.batch_metadata,
        )


class BatchList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[BatchObject]
    first_id: str | None
    last_id: str | None
    has_more: bool

    @classmethod
    def of(cls, rows: list[Batch], has_more: bool) -> BatchList:
        data = [BatchObject.of(row) for row in rows]
        return cls(
            data=data,
            first_id=data[0].id if data else None,
            last_id=data[-1].id if data else None,
            has_more=has_more,
        )
