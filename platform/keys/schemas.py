"""Bodies of the keys API. A key's secret appears in exactly one response: its creation's."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from msgspec import UNSET, Meta, Struct, UnsetType

from hydrant.platform.auth.repository import parse_scopes
from hydrant.platform.db.models import ApiKey
from hydrant.platform.prices.decimal_text import DecimalText, format_decimal

AwareDateTime = Annotated[datetime, Meta(tz=True)]
KeyStatus = Literal["active", "rotating", "rotated", "expired", "revoked"]
MAX_GRACE_S = 30 * 24 * 3600
BigCount = Annotated[int, Meta(ge=0, le=2**62)]
KEY_BUDGETS = ("tokens_per_day", "tokens_per_month", "spend_per_day", "spend_per_month")
DEFAULT_GRACE_S = 24 * 3600


def key_status(key: ApiKey, now: datetime) -> KeyStatus:
    """Why a key does or does not authenticate now, in one word."""
    if key.revoked_at is not None and key.revoked_at <= now:
        return "revoked"
    if key.expires_at is not None and key.expires_at <= now:
        return "expired"
    if key.grace_until is not None:
        return "rotating" if now < key.grace_until else "rotated"
    return "active"


class KeyCreate(Struct, kw_only=True, forbid_unknown_fields=True):
    """`tenant_id` null makes an admin key (scope `admin`, no tenant)."""

    tenant_id: str | None
    name: Annotated[str, Meta(max_length=200)] = ""
    expires_at: AwareDateTime | None = None
    # The tenant's project the key belongs to, by id or name; None: a tenant-level key.
    project: Annotated[str, Meta(min_length=1, max_length=100)] | None = None
    # The key's own budgets (None: none), checked beside its project's and tenant's.
    tokens_per_day: BigCount | None = None
    tokens_per_month: BigCount | None = None
    spend_per_day: DecimalText | None = None
    spend_per_month: DecimalText | None = None

    def budgets(self) -> dict[str, int | str | None]:
        return {name: getattr(self, name) for name in KEY_BUDGETS}


class KeyUpdate(Struct, kw_only=True, forbid_unknown_fields=True):
    """A key's own budgets after creation: a field left out is unchanged, `null` clears it.

    Only budgets: a key's tenant, project and scopes are what it was made for (make
    another key for another purpose), and its secret never changes (rotate it)."""

    tokens_per_day: BigCount | UnsetType | None = UNSET
    tokens_per_month: BigCount | UnsetType | None = UNSET
    spend_per_day: DecimalText | UnsetType | None = UNSET
    spend_per_month: DecimalText | UnsetType | None = UNSET

    def budgets(self) -> dict[str, int | str | None]:
        """The budgets the body sets (`None`: clear it), by name."""
        given = {name: getattr(self, name) for name in KEY_BUDGETS}
        return {name: value for name, value in given.items() if value is not UNSET}


class KeyRotate(Struct, kw_only=True, forbid_unknown_fields=True):
    """The old key keeps working for `grace_seconds`; the new one expires at `expires_at`."""

    grace_seconds: Annotated[int, Meta(ge=0, le=MAX_GRACE_S)] = DEFAULT_GRACE_S
    expires_at: AwareDateTime | None = None


class KeyView(Struct, kw_only=True):
    id: str
    object: Literal["api_key"] = "api_key"
    name: str
    prefix: str
    tenant_id: str | None
    scopes: list[str]
    status: KeyStatus
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    grace_until: datetime | None
    last_used_at: datetime | None
    rotated_from_id: str | None
    project_id: str | None = None
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    spend_per_day: str | None = None
    spend_per_month: str | None = None

    @classmethod
    def of(cls, key: ApiKey, now: datetime) -> KeyView:
        return cls(
            id=key.id,
            name=key.name,
            prefix=key.prefix,
            tenant_id=key.tenant_id,
            scopes=sorted(parse_scopes(key.scopes)),
            status=key_status(key, now),
            created_at=key.created_at,
            expires_at=key.expires_at,
            revoked_at=key.revoked_at,
            grace_until=key.grace_until,
            last_used_at=key.last_used_at,
            rotated_from_id=key.rotated_from_id,
            project_id=key.project_id,
            tokens_per_day=key.tokens_per_day,
            tokens_per_month=key.tokens_per_month,
            spend_per_day=None if key.spend_per_day is None else format_decimal(key.spend_per_day),
            spend_per_month=(
                None if key.spend_per_month is None else format_decimal(key.spend_per_month)
            ),
        )


class CreatedKey(Struct, kw_only=True):
    """The new key and, once only, its secret: store it now, it cannot be shown again."""

    object: Literal["api_key.secret"] = "api_key.secret"
    key: KeyView
    secret: str


class RotatedKey(Struct, kw_only=True):
    object: Literal["api_key.rotation"] = "api_key.rotation"
    key: KeyView
    secret: str
    previous: KeyView


class KeyList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[KeyView]
    has_more: bool
