"""The one query authentication makes: a key by its public prefix, with tenant and plan.

One round trip on a cache miss: the key row, its project, its tenant's status and
time zone, and the tenant's plan (the default plan when the tenant has none set).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.db.models import DEFAULT_PLAN_ID, ApiKey, Plan, Project, Tenant
from hydrant.platform.quotas.policy import KeyQuota, PlanPolicy, ProjectQuota


@dataclass(frozen=True)
class KeyRecord:
    """What the auth cache holds for a key: enough to decide without the database."""

    key_id: str
    prefix: str
    key_hash: str
    tenant_id: str | None
    scopes: frozenset[str]
    expires_at: datetime | None
    revoked_at: datetime | None
    grace_until: datetime | None
    tenant_active: bool
    timezone: str
    plan: PlanPolicy | None
    project: ProjectQuota | None = None  # the key's project (None: a tenant-level key)
    key_quota: KeyQuota | None = None  # the key's own budgets (None: none)

    def usable_at(self, now: datetime) -> bool:
        """Not revoked, not expired, and (if rotated) still within its grace period."""
        return all(
            moment is None or now < moment
            for moment in (self.revoked_at, self.expires_at, self.grace_until)
        )


def parse_scopes(text: str) -> frozenset[str]:
    return frozenset(part for part in text.split(",") if part)


async def find_key_record(session: AsyncSession, prefix: str) -> KeyRecord | None:
    statement = (
        select(ApiKey, Tenant.status, Tenant.timezone, Plan, Project)
        .outerjoin(Tenant, ApiKey.tenant_id == Tenant.id)
        .outerjoin(Project, ApiKey.project_id == Project.id)
        .outerjoin(Plan, Plan.id == func.coalesce(Tenant.plan_id, DEFAULT_PLAN_ID))
        .where(ApiKey.prefix == prefix)
    )
    row = (await session.execute(statement)).first()
    if row is None:
        return None
    key, tenant_status, timezone, plan, project = row
    has_tenant = key.tenant_id is not None
    return KeyRecord(
        key_id=key.id,
        prefix=key.prefix,
        key_hash=key.key_hash,
        tenant_id=key.tenant_id,
        scopes=parse_scopes(key.scopes),
        expires_at=key.expires_at,
        revoked_at=key.revoked_at,
        grace_until=key.grace_until,
        tenant_active=(not has_tenant) or tenant_status == "active",
        timezone=timezone or "UTC",
        plan=PlanPolicy.from_row(plan) if has_tenant and plan is not None else None,
        project=ProjectQuota.from_row(project) if project is not None else None,
        key_quota=KeyQuota.of(key),
    )
