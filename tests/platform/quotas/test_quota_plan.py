"""Building a request's checks from the tenant's quota, its tier and its reserved maximum."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, cast

import pytest
from quota_helpers import ManualClock

from hydrant.platform.quotas import (
    Admission,
    BudgetCheck,
    ConcurrencyCheck,
    InMemoryQuotaBackend,
    LimitUsage,
    QuotaExceeded,
    TenantQuota,
    WindowCheck,
    build_checks,
    classify,
    settle_amounts,
)
from hydrant.platform.quotas.periods import BudgetPeriod, period_window
from hydrant.platform.quotas.plan import batch_checks, budget_amounts
from hydrant.platform.quotas.policy import KeyQuota, ProjectQuota

AT = datetime(2025, 12, 31, 23, 30, tzinfo=UTC)
FULL = TenantQuota(
    requests_per_minute=600,
    tokens_per_minute=100_000,
    max_concurrent=8,
    tokens_per_day=1_000_000,
    tokens_per_month=20_000_000,
    spend_per_day=Decimal("5.00"),
    spend_per_month=Decimal("100"),
)


def test_limited_tier_adds_the_per_key_rate_and_every_quota() -> None:
    checks = build_checks(
        tenant_id="t1",
        key_id="k1",
        tier=classify(1000, 24),
        quota=FULL,
        reserve_tokens=1024,
        reserve_money=Decimal("0.0012345"),
        at=AT,
    )
    by_name = {c.name: c for c in checks}
    assert by_name["key_rate"] == WindowCheck("key_rate", "{t1}:key:k1:limited", 10, 1.0)
    assert by_name["tenant_rpm"] == WindowCheck("tenant_rpm", "{t1}:rpm", 600, 60.0)
    assert by_name["tenant_tpm"] == WindowCheck("tenant_tpm", "{t1}:tpm", 100_000, 60.0, 1024)
    assert by_name["concurrency"] == ConcurrencyCheck("concurrency", "{t1}:conc", 8, 900.0)
    day_end = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    assert by_name["tokens_day"] == BudgetCheck(
        "tokens_day", "{t1}:tokens:day:2025-12-31", 1_000_000, 1024, day_end, 900.0
    )
    assert by_name["tokens_month"].key == "{t1}:tokens:month:2025-12"
    spend_day = by_name["spend_day"]
    assert isinstance(spend_day, BudgetCheck)
    assert (spend_day.limit, spend_day.amount) == (5_000_000, 1234)  # micro-units, half-even
    assert by_name["spend_month"].limit == 100_000_000
    assert all(c.key.startswith("{t1}:") for c in checks)


def test_free_tier_without_quota_has_no_checks() -> None:
    checks = build_checks(
        tenant_id="t1",
        key_id="k1",
        tier=classify(10, 10),
        quota=TenantQuota(),
        reserve_tokens=20,
        reserve_money=Decimal(0),
        at=AT,
    )
    assert checks == ()


@pytest.mark.parametrize("bad", ["", "a b", "{x}", "a:b"])
def test_ids_that_would_break_key_names_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        build_checks(
            tenant_id=bad,
            key_id="k",
            tier=classify(1, 1),
            quota=FULL,
            reserve_tokens=2,
            reserve_money=Decimal(0),
            at=AT,
        )


def test_float_money_in_a_quota_is_refused() -> None:
    with pytest.raises(TypeError):
        TenantQuota(spend_per_day=cast(Any, 5.0))


async def test_a_spend_budget_round_trip_in_micro_units() -> None:
    backend = InMemoryQuotaBackend(clock=ManualClock(AT.timestamp()))
    quota = TenantQuota(spend_per_day=Decimal("0.01"), tokens_per_minute=10_000)

    def plan(cost: str) -> tuple[BudgetCheck | WindowCheck | ConcurrencyCheck, ...]:
        return build_checks(
            tenant_id="t1",
            key_id="k1",
            tier=classify(100, 100),
            quota=quota,
            reserve_tokens=200,
            reserve_money=Decimal(cost),
            at=AT,
        )

    admission = await backend.admit(plan("0.006"))
    await backend.settle(admission, settle_amounts(admission, tokens=150, money=Decimal("0.004")))
    spend = next(c for c in plan("0") if c.name == "spend_day")
    assert await backend.usage(spend) == LimitUsage(used=4000, reserved=0)
    await backend.admit(plan("0.006"))
    with pytest.raises(QuotaExceeded) as info:
        await backend.admit(plan("0.000001"))
    assert info.value.refusal.limit_name == "spend_day"


def test_settle_amounts_only_names_held_checks() -> None:
    checks = build_checks(
        tenant_id="t1",
        key_id="k1",
        tier=classify(600, 0),
        quota=TenantQuota(tokens_per_day=10, spend_per_month=Decimal(1), max_concurrent=1),
        reserve_tokens=600,
        reserve_money=Decimal("0.5"),
        at=AT,
    )
    amounts = settle_amounts(Admission("rid", checks), tokens=321, money=Decimal("0.1234564"))
    assert amounts == {"tokens_day": 321, "spend_month": 123_456}


def test_a_batch_reserves_its_keys_and_projects_budgets_on_the_interactive_counters() -> None:
    """A batch holds the key's and the project's budgets as the very checks an interactive
    request of that key holds (same names, same counters, its own amounts), none of the
    project's per-minute rates, and a line's settlement names every one of them."""
    project = ProjectQuota(
        "prj_1",
        requests_per_minute=5,
        tokens_per_minute=1000,
        tokens_per_day=10_000,
        spend_per_month=Decimal("2"),
    )
    key = KeyQuota("key_1", tokens_per_month=50_000, spend_per_day=Decimal("1"))
    quota = TenantQuota(tokens_per_day=1_000_000)
    batch = batch_checks(
        tenant_id="t1",
        quota=quota,
        reserve_tokens=4000,
        reserve_money=Decimal("0.25"),
        at=AT,
        lease_s=90_000,
        project=project,
        key_quota=key,
    )
    interactive = build_checks(
        tenant_id="t1",
        key_id="key_1",
        tier=classify(10, 10),
        quota=quota,
        reserve_tokens=4000,
        reserve_money=Decimal("0.25"),
        at=AT,
        project=project,
        key_quota=key,
    )
    budgets = {c.name: c.key for c in interactive if isinstance(c, BudgetCheck)}
    assert {c.name: c.key for c in batch} == budgets
    assert sorted(budgets) == [
        "key_spend_day",
        "key_tokens_month",
        "project_spend_month",
        "project_tokens_day",
        "tokens_day",
    ]
    by_name = {c.name: c for c in batch}
    assert by_name["key_spend_day"].key == "{t1}:keybudget:key_1:spend:day:2025-12-31"
    assert (by_name["key_spend_day"].limit, by_name["key_spend_day"].amount) == (
        1_000_000,
        250_000,
    )
    assert by_name["project_tokens_day"].key == "{t1}:project:prj_1:tokens:day:2025-12-31"
    assert all(c.lease_s == 90_000 for c in batch)
    amounts = budget_amounts(Admission("batch_1", batch), tokens=321, micros=1234)
    assert amounts == {
        "tokens_day": 321,
        "project_tokens_day": 321,
        "project_spend_month": 1234,
        "key_tokens_month": 321,
        "key_spend_day": 1234,
    }
    # A project without budgets (rates only) and no key budgets: the tenant's alone.
    rates_only = ProjectQuota("prj_2", requests_per_minute=5, tokens_per_minute=1000)
    alone = batch_checks(
        tenant_id="t1",
        quota=quota,
        reserve_tokens=4000,
        reserve_money=Decimal("0.25"),
        at=AT,
        lease_s=90_000,
        project=rates_only,
    )
    assert [c.name for c in alone] == ["tokens_day"]


@pytest.mark.parametrize(
    ("at", "period", "label", "end"),
    [
        (datetime(2025, 12, 31, 23, 59, 59, tzinfo=UTC), "day", "2025-12-31", datetime(2026, 1, 1)),
        (datetime(2025, 12, 31, 23, 59, 59, tzinfo=UTC), "month", "2025-12", datetime(2026, 1, 1)),
        (datetime(2024, 2, 29, 12, tzinfo=UTC), "month", "2024-02", datetime(2024, 3, 1)),
        (datetime(2024, 3, 1, 0, 0, tzinfo=UTC), "day", "2024-03-01", datetime(2024, 3, 2)),
        # 01:00 in UTC+2 is still the previous UTC day
        (
            datetime(2024, 3, 1, 1, 0, tzinfo=timezone(timedelta(hours=2))),
            "day",
            "2024-02-29",
            datetime(2024, 3, 1),
        ),
    ],
)
def test_periods_are_utc_calendar_days_and_months(
    at: datetime, period: str, label: str, end: datetime
) -> None:
    window = period_window(period, at)
    assert window.period is BudgetPeriod(period)
    assert window.label == label
    assert window.end == end.replace(tzinfo=UTC)
    assert window.start <= at < window.end


def test_naive_datetimes_are_refused() -> None:
    with pytest.raises(ValueError, match="aware"):
        period_window("day", datetime(2024, 1, 1))
