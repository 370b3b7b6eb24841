"""Who is calling: the authenticated key, its tenant and what its plan lets it do.

The inference path (`platform/inference/`, the lead's) reads `tenant_id`,
`key_id`, `key_prefix`, `weight` (fair-share weight of the tenant's plan) and
`allowed_models` (None = every model); quotas read `plan` (tiers, limits,
budgets) and `timezone` (where the tenant's days and months begin). The
authenticator fills all of it from one cached lookup, so the hot path needs no
second query for the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from hydrant.platform.quotas.policy import KeyQuota, PlanPolicy, ProjectQuota

INFERENCE_SCOPE: Final = "inference"
ADMIN_SCOPE: Final = "admin"
SCOPES: Final = frozenset({INFERENCE_SCOPE, ADMIN_SCOPE})


@dataclass(frozen=True)
class Principal:
    tenant_id: str | None
    key_id: str
    key_prefix: str
    scopes: frozenset[str]
    plan_id: str | None = None
    weight: float = 1.0
    allowed_models: frozenset[str] | None = None
    plan: PlanPolicy | None = field(default=None, compare=False)
    timezone: str = "UTC"
    # The key's project (its id and budgets); None: a tenant-level key.
    project: ProjectQuota | None = field(default=None, compare=False)
    key_quota: KeyQuota | None = field(default=None, compare=False)  # the key's budgets

    @property
    def project_id(self) -> str | None:
        return self.project.project_id if self.project is not None else None

    @property
    def is_admin(self) -> bool:
        return ADMIN_SCOPE in self.scopes


# The operator at the console (`hydrant tenants …`, `hydrant keys …`): admin rights,
# no key. Only in-process callers can hold it; no request can authenticate as it.
CONSOLE = Principal(
    tenant_id=None, key_id="console", key_prefix="console", scopes=frozenset({ADMIN_SCOPE})
)
