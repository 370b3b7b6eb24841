"""Bodies of `GET/PUT /admin/tenants/{id}/digest`: when a tenant's digest goes out, and to whom."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import UNSET, Meta, Struct, UnsetType

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
