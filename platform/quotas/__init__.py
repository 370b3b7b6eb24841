"""Quotas: length tiers, limit checks, and the stores that count them (memory, Redis)."""

from hydrant.platform.quotas.backend import QuotaBackend
from hydrant.platform.quotas.checks import (
    Admission,
    BudgetCheck,
    Check,
    ConcurrencyCheck,
    LimitKind,
    LimitUsage,
    QuotaBackendUnavailable,
    QuotaExceeded,
    Refusal,
    WindowCheck,
    WindowState,
)
from hydrant.platform.quotas.guard import FailureMode, GuardedQuotaBackend
from hydrant.platform.quotas.memory_backend import InMemoryQuotaBackend
from hydrant.platform.quotas.plan import TenantQuota, build_checks, settle_amounts
from hydrant.platform.quotas.tiers import (
    RequestTooLargeError,
    Tier,
    TierDecision,
    TierPolicy,
    classify,
)

__all__ = [
    "Admission",
    "BudgetCheck",
    "Check",
    "ConcurrencyCheck",
    "FailureMode",
    "GuardedQuotaBackend",
    "InMemoryQuotaBackend",
    "LimitKind",
    "LimitUsage",
    "QuotaBackend",
    "QuotaBackendUnavailable",
    "QuotaExceeded",
    "Refusal",
    "RequestTooLargeError",
    "TenantQuota",
    "Tier",
    "TierDecision",
    "TierPolicy",
    "WindowCheck",
    "WindowState",
    "build_checks",
    "classify",
    "settle_amounts",
]
