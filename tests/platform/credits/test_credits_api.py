"""Credits over the API: admins grant, list and void; a tenant reads its balance; ledger
entries are paid from grants in priority order, exactly, once. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from decimal import Decimal
from typing import Any

from control_plane_helpers import ControlPlane, bearer
from sqlalchemy import func, select

from hydrant.platform.db.base import utcnow
from hydrant.platform.db.models import CreditApplication, LedgerEntry
from hydrant.platform.ledger.repository import ensure_model


async def grant(cp: ControlPlane, tenant_id: str, **body: Any) -> dict[str, Any]:
    response = await cp.client.post(
        f"/admin/tenants/{tenant_id}/credits", json=body, headers=cp.admin
    )
    assert response.status_code == 201, response.text
    return dict(response.json())


async def test_grant_list_void_and_the_tenants_own_balance(cp: ControlPlane) -> None:
    tenant, secret = await cp.tenant_with_key("acme")
    other, other_secret = await cp.tenant_with_key("other")
    soon = (utcnow() + timedelta(days=10)).isoformat()
    promo = await grant(cp, tenant["id"], kind="promo", amount="1.5", expires_at=soon)
    assert (promo["kind"], promo["amount"], promo["remaining"]) == ("promo", "1.500000", "1.500000")
    paid = await grant(cp, tenant["id"], kind="paid", amount="3", note="invoice 7")
    path = f"/admin/tenants/{tenant['id']}/credits"
    listed = (await cp.client.get(path, headers=cp.admin)).json()
    assert listed["available"] == "4.500000" and listed["currency"] == "USD"
    assert [g["id"] for g in listed["grants"]] == [promo["id"], paid["id"]]

    own = await cp.client.get("/account/balance", headers=bearer(secret))
    assert own.status_code == 200 and own.json()["available"] == "4.500000"
    theirs = await cp.client.get("/account/balance", headers=bearer(other_secret))
    assert theirs.json()["available"] == "0.000000" and theirs.json()["grants"] == []

    assert (await cp.client.get("/account/balance")).status_code == 401
    assert (await cp.client.get(path)).status_code == 401
    assert (await cp.client.get(path, headers=bearer(secret))).status_code in (401, 403)
    missing = await cp.client.get("/admin/tenants/ten_nope/credits", headers=cp.admin)
    assert missing.status_code == 404
    wrong_tenant = await cp.client.post(
        f"/admin/tenants/{other['id']}/credits/{promo['id']}/void", headers=cp.admin
    )
    assert wrong_tenant.status_code == 404  # a grant of another tenant is not found there

    voided = await cp.client.post(f"{path}/{promo['id']}/void", headers=cp.admin)
    assert voided.status_code == 200, voided.text
    assert voided.json()["voided_at"] is not None and voided.json()["remaining"] == "0.000000"
    after = (await cp.client.get("/account/balance", headers=bearer(secret))).json()
    assert after["available"] == "3.000000"


async def test_bad_grants_are_refused(cp: ControlPlane) -> None:
    tenant = await cp.create_tenant("acme")
    path = f"/admin/tenants/{tenant['id']}/credits"
    past = (utcnow() - timedelta(days=1)).isoformat()
    for body in (
        {"kind": "gift", "amount": "1"},
        {"kind": "paid", "amount": "0"},
        {"kind": "paid", "amount": 1.5},
        {"kind": "paid", "amount": "0.0000001"},
        {"kind": "paid", "amount": "1", "expires_at": past},
        {"kind": "paid", "amount": "1", "colour": "red"},
    ):
        response = await cp.client.post(path, json=body, headers=cp.admin)
        assert response.status_code == 400, (body, response.text)
    await grant(cp, tenant["id"], kind="paid", amount="1", currency="EUR")
    mixed = await cp.client.post(
        path, json={"kind": "paid", "amount": "1", "currency": "USD"}, headers=cp.admin
    )
    assert mixed.status_code == 409


async def test_ledger_entries_are_paid_in_priority_order_once(cp: ControlPlane) -> None:
    tenant, secret = await cp.tenant_with_key("acme")
    paid = await grant(cp, tenant["id"], kind="paid", amount="2")
    soon = (utcnow() + timedelta(days=5)).isoformat()
    promo = await grant(cp, tenant["id"], kind="promo", amount="1", expires_at=soon)
    start = utcnow() + timedelta(seconds=1)

    async def add_entries() -> None:
        from hydrant.platform.services import services_of

        async with services_of(cp.app).database.session() as session:
            model_id = await ensure_model(session, "demo")
            for index, charged in enumerate(("0.6", "0.6", "0.600001", "0")):
                at = start + timedelta(seconds=index)
                session.add(
                    LedgerEntry(
                        request_id=f"req_credit_{index}",
                        tenant_id=tenant["id"],
                        model_id=model_id,
                        status="finished",
                        charged=Decimal(charged),
                        started_at=at,
                        finished_at=at,
                    )
                )

    await cp.in_app(add_entries)
    balance = (await cp.client.get("/account/balance", headers=bearer(secret))).json()
    assert balance["available"] == "1.199999"
    by_id = {g["id"]: g for g in balance["grants"]}
    assert (by_id[promo["id"]]["used"], by_id[paid["id"]]["used"]) == ("1.000000", "0.800001")

    rows = await cp.in_app(lambda: _applications(cp))
    assert set(rows) == {  # which grants paid which entry: promo first, then paid
        ("req_credit_0", promo["id"], Decimal("0.6")),
        ("req_credit_1", promo["id"], Decimal("0.4")),
        ("req_credit_1", paid["id"], Decimal("0.2")),
        ("req_credit_2", paid["id"], Decimal("0.600001")),
    }
    assert len(rows) == 4
    again = (await cp.client.get("/account/balance", headers=bearer(secret))).json()
    assert again["available"] == "1.199999"  # applied once, whatever the number of reads
    ledger_sum = await cp.execute(
        select(func.sum(LedgerEntry.charged)).where(LedgerEntry.tenant_id == tenant["id"])
    )
    applied = await cp.execute(select(func.sum(CreditApplication.amount)))
    assert Decimal(applied) == Decimal(ledger_sum) == Decimal("1.800001")


async def _applications(cp: ControlPlane) -> list[tuple[str, str | None, Decimal]]:
    from hydrant.platform.services import services_of

    async with services_of(cp.app).database.session() as session:
        result = await session.execute(
            select(
                CreditApplication.request_id, CreditApplication.grant_id, CreditApplication.amount
            ).order_by(CreditApplication.request_id, CreditApplication.grant_id)
        )
        return [(r, g, Decimal(a)) for r, g, a in result.all()]


async def test_concurrent_payers_pay_each_entry_once(cp: ControlPlane) -> None:
    """Payers racing on one tenant (gateways' background payments, balance reads): each
    entry is settled once, on SQLite (the settlement's key) and PostgreSQL (the row lock)."""
    from hydrant.platform.credits.service import pay_pending
    from hydrant.platform.services import services_of

    tenant = await cp.create_tenant("acme")
    await grant(cp, tenant["id"], kind="paid", amount="5")
    start = utcnow() + timedelta(seconds=1)
    database = services_of(cp.app).database

    async def race() -> list[int]:
        async with database.session() as session:
            model_id = await ensure_model(session, "demo")
            for index in range(20):
                at = start + timedelta(milliseconds=index)
                session.add(
                    LedgerEntry(
                        request_id=f"req_race_{index}",
                        tenant_id=tenant["id"],
                        model_id=model_id,
                        status="finished",
                        charged=Decimal("0.123457"),
                        started_at=at,
                        finished_at=at,
                    )
                )
        return await asyncio.gather(
            *(pay_pending(database, tenant["id"], utcnow()) for _ in range(6))
        )

    paid = await cp.in_app(race)
    assert sum(paid) == 20  # every entry paid by exactly one of the racers
    applied = await cp.execute(
        select(func.sum(CreditApplication.amount)).where(
            CreditApplication.tenant_id == tenant["id"]
        )
    )
    assert Decimal(applied) == 20 * Decimal("0.123457")


async def test_low_balance_thresholds_are_set_and_read_by_admins_only(cp: ControlPlane) -> None:
    tenant, secret = await cp.tenant_with_key("acme")
    path = f"/admin/tenants/{tenant['id']}/credits/alerts"
    empty = await cp.client.get(path, headers=cp.admin)
    assert empty.status_code == 200 and empty.json()["thresholds"] == []
    put = await cp.client.put(path, json={"thresholds": ["10", "2.5"]}, headers=cp.admin)
    assert put.status_code == 200, put.text
    assert [t["amount"] for t in put.json()["thresholds"]] == ["10.000000", "2.500000"]
    assert put.json()["thresholds"][0] == {"amount": "10.000000", "below": False, "crossings": 0}
    again = await cp.client.get(path, headers=cp.admin)
    assert again.json() == put.json()
    for bad in (["-1"], ["0"], ["1.1234567"], [1.5], ["1"] * 11):
        refused = await cp.client.put(path, json={"thresholds": bad}, headers=cp.admin)
        assert refused.status_code == 400, (bad, refused.text)
    assert (await cp.client.get(path, headers=bearer(secret))).status_code in (401, 403)
    cleared = await cp.client.put(path, json={"thresholds": []}, headers=cp.admin)
    assert cleared.json()["thresholds"] == []
