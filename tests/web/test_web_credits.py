"""A tenant's credits page: an admin grants and voids there (CSRF-checked forms, the API's
validation), a tenant sees its own balance and grants and no forms, another tenant's page
is a 404, anonymous is sent to sign in; the balance shown is `/account/balance`'s."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

from control_plane_helpers import ControlPlane, bearer
from web_helpers import page_token, sign_in

from hydrant.platform.db.base import utcnow
from hydrant.platform.db.models import LedgerEntry
from hydrant.platform.ledger.repository import ensure_model
from hydrant.platform.services import services_of


def _balance(html: str) -> str:
    match = re.search(r'id="credit-balance" data-value="([^"]+)"', html)
    assert match is not None
    return match.group(1)


def _grants(html: str) -> dict[str, tuple[str, str]]:
    """grant id -> (remaining, status) as the page's table shows them."""
    rows = re.findall(
        r'<tr data-grant="([^"]+)">.*?data-col="remaining">([^<]+)<.*?data-col="status">([^<]+)<',
        html,
        re.S,
    )
    return {gid: (left, status) for gid, left, status in rows}


async def test_admins_grant_and_void_and_the_tenant_reads_its_own(cp: ControlPlane) -> None:
    acme, acme_key = await cp.tenant_with_key("acme")
    globex, _ = await cp.tenant_with_key("globex")
    path = f"/ui/tenants/{acme['id']}/credits"
    anonymous = await cp.client.get(path)
    assert anonymous.status_code == 303 and "/ui/sign-in" in anonymous.headers["location"]

    await sign_in(cp.client, cp.admin_secret)
    empty = await cp.client.get(path)
    assert empty.status_code == 200, empty.text
    assert _balance(empty.text) == "0.000000" and "No credit granted." in empty.text
    tenant_page = await cp.client.get(f"/ui/tenants/{acme['id']}")
    assert f'href="{path}"' in tenant_page.text  # reached from the tenant's admin page

    token = await page_token(cp.client, path)
    refused = await cp.client.post(
        path, data={"kind": "paid", "amount": "1.5e3", "csrf_token": token}
    )
    assert refused.status_code == 400 and 'role="alert"' in refused.text
    assert 'value="1.5e3"' in refused.text  # the form comes back as it was typed
    no_token = await cp.client.post(path, data={"kind": "paid", "amount": "1"})
    assert no_token.status_code == 403

    soon = (utcnow() + timedelta(days=30)).date().isoformat()
    for fields in (
        {"kind": "promo", "amount": "2.50", "expires_on": soon, "note": "launch"},
        {"kind": "paid", "amount": "10", "note": "PO 17"},
    ):
        done = await cp.client.post(path, data={**fields, "csrf_token": token})
        assert done.status_code == 303, done.text
        assert done.headers["location"] == f"{path}?notice=granted"
    listed = (await cp.client.get(f"/admin/tenants/{acme['id']}/credits", headers=cp.admin)).json()
    promo, paid = listed["grants"]
    assert (promo["kind"], promo["amount"], promo["note"]) == ("promo", "2.500000", "launch")
    assert promo["expires_at"].startswith(f"{soon}T00:00:00")  # that day's 00:00 UTC
    assert (paid["kind"], paid["amount"], paid["expires_at"]) == ("paid", "10.000000", None)

    async def spend() -> None:  # a ledger entry, paid from the promo grant first
        async with services_of(cp.app).database.session() as session:
            model_id = await ensure_model(session, "demo")
            at = utcnow()
            session.add(
                LedgerEntry(
                    request_id="req_web_credit", tenant_id=acme["id"], model_id=model_id,
                    status="finished", charged=Decimal("0.75"), started_at=at, finished_at=at,
                )
            )  # fmt: skip

    await cp.in_app(spend)
    page = await cp.client.get(path)
    assert _balance(page.text) == "11.750000"
    assert _grants(page.text) == {
        promo["id"]: ("1.750000", "live"),
        paid["id"]: ("10.000000", "live"),
    }
    voided = await cp.client.post(f"{path}/{promo['id']}/void", data={"csrf_token": token})
    assert voided.status_code == 303 and voided.headers["location"] == f"{path}?notice=voided"
    wrong = await cp.client.post(
        f"/ui/tenants/{globex['id']}/credits/{paid['id']}/void", data={"csrf_token": token}
    )
    assert wrong.status_code == 404  # a grant of another tenant is not found there

    await sign_in(cp.client, acme_key)  # the tenant: its own balance, no forms
    own = await cp.client.get(path)
    assert own.status_code == 200, own.text
    api = (await cp.client.get("/account/balance", headers=bearer(acme_key))).json()
    assert _balance(own.text) == api["available"] == "10.000000"
    assert _grants(own.text) == {
        promo["id"]: ("0.000000", "voided"),
        paid["id"]: ("10.000000", "live"),
    }
    assert "Grant credit" not in own.text and "/void" not in own.text
    assert f'href="{path}"' in own.text  # in the tenant's navigation
    tenant_token = await page_token(cp.client, path)
    forbidden = await cp.client.post(
        path, data={"kind": "paid", "amount": "1000", "csrf_token": tenant_token}
    )
    assert forbidden.status_code == 403  # a tenant cannot grant itself credit
    assert (await cp.client.get(f"/ui/tenants/{globex['id']}/credits")).status_code == 404
