"""Bodies of `GET/PUT /admin/tenants/{id}/digest`: when a tenant's digest goes out, and to whom."""

from __future__ import annotations

from datetime import date, datetime
from typing import TYPE_CHECKING, Annotated, Literal

from msgspec import UNSET, Meta, Struct, UnsetType

if TYPE_CHECKING:
    from hydrant.platform.db.models import DigestSend

Email = Annotated[str, Meta(min_length=3, max_length=320)]
Hour = Annotated[int, Meta(ge=0, le=23)]
TimeZoneName = Annotated[str, Meta(min_length=1, max_length=64)]


class DigestSettingsUpdate(Struct, kw_only=True, forbid_unknown_fields=True):
    """A field left out is unchanged; `recipients` replaces the whole list."""

    enabled: bool | UnsetType = UNSET
    send_hour: Hour | UnsetType = UNSET
    timezone: TimeZoneName | UnsetType = UNSET
    recipients: Annotated[list[Email], Meta(max_length=100)] | UnsetType = UNSET


class DigestSettingsView(Struct, kw_only=True):
    object: Literal["digest_settings"] = "digest_settings"
    tenant_id: str
    enabled: bool
    send_hour: int
    timezone: str
    recipients: list[str]
    unsubscribed: list[str]


class StuckDigestSend(Struct, kw_only=True):
    """A digest claim left `sending` by a worker that stopped mid-send."""

    object: Literal["digest_send"] = "digest_send"
    id: str
    kind: str  # "tenant" or "admin"
    subject_id: str  # the tenant id, or "platform" for the admin digest
    day: date
    claimed_at: datetime

    @classmethod
    def of(cls, send: DigestSend) -> StuckDigestSend:
        return cls(
            id=send.id,
            kind=send.kind,
            subject_id=send.subject_id,
            day=send.day,
            claimed_at=send.claimed_at,
        )


class StuckDigestList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[StuckDigestSend]


class DigestResend(Struct, kw_only=True):
    """What re-sending a stuck digest did: `sent`, `skipped`, `no_recipients`, …"""

    object: Literal["digest_resend"] = "digest_resend"
    id: str
    outcome: str
    recipients: int
