"""Bodies of the projects API (`/admin/tenants/{id}/projects`, `/account/projects`).

Rates and budgets are NULL for none; money travels as decimal strings (prices/decimal_text.py).
In an update a field left out is unchanged and `null` clears it.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated

from msgspec import UNSET, Meta, Struct, UnsetType

from hydrant.platform.db.models import Project
from hydrant.platform.prices.decimal_text import DecimalText, format_decimal

ProjectName = Annotated[str, Meta(min_length=1, max_length=100)]
BigCount = Annotated[int, Meta(ge=0, le=2**62)]
Count = Annotated[int, Meta(ge=0, le=2**31 - 1)]


class ProjectCreate(Struct, kw_only=True, forbid_unknown_fields=True):
    name: ProjectName
    requests_per_minute: Count | None = None
    tokens_per_minute: BigCount | None = None
    tokens_per_day: BigCount | None = None
    tokens_per_month: BigCount | None = None
    spend_per_day: DecimalText | None = None
    spend_per_month: DecimalText | None = None


class ProjectUpdate(Struct, kw_only=True, forbid_unknown_fields=True):
    name: ProjectName | UnsetType = UNSET
    requests_per_minute: Count | UnsetType | None = UNSET
    tokens_per_minute: BigCount | UnsetType | None = UNSET
    tokens_per_day: BigCount | UnsetType | None = UNSET
    tokens_per_month: BigCount | UnsetType | None = UNSET
    spend_per_day: DecimalText | UnsetType | None = UNSET
    spend_per_month: DecimalText | UnsetType | None = UNSET


class ProjectView(Struct, kw_only=True):
    id: str
    object: str = "organization.project"  # OpenAI's name for the object
    tenant_id: str
    name: str
    status: str
    requests_per_minute: int | None
    tokens_per_minute: int | None
    tokens_per_day: int | None
    tokens_per_month: int | None
    spend_per_day: str | None
    spend_per_month: str | None
    created_at: datetime
    archived_at: datetime | None

    @classmethod
    def of(cls, project: Project) -> ProjectView:
        def money(value: Decimal | None) -> str | None:
            return None if value is None else format_decimal(value)

        return cls(
            id=project.id,
            tenant_id=project.tenant_id,
            name=project.name,
            status=project.status,
            requests_per_minute=project.requests_per_minute,
            tokens_per_minute=project.tokens_per_minute,
            tokens_per_day=project.tokens_per_day,
            tokens_per_month=project.tokens_per_month,
            spend_per_day=money(project.spend_per_day),
            spend_per_month=money(project.spend_per_month),
            created_at=project.created_at,
            archived_at=project.archived_at,
        )


class ProjectList(Struct, kw_only=True):
    data: list[ProjectView]
    object: str = "list"
