"""The cost report page and its CSV against `/admin/reports/costs`, and a tenant's usage page."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from control_plane_helpers import ControlPlane
from report_factories import add_models, insert_rows, row
from web_helpers import sign_in

from hydrant.platform.services import services_of

DAY = datetime(2026, 3, 5, tzinfo=UTC)
PERIOD = {"since": "2026-03-04", "until": "2026-03-06"}


async def seed(cp: ControlPlane) -> tuple[dict[str, Any], str, dict[str, Any], str]:
    acme, acme_key = await cp.tenant_with_key("acme")
    globex, globex_key = await cp.tenant_with_key("globex")
    entries = [
        row(acme["id"], "alpha", DAY + timedelta(hours=1), "0.333333", request_id="w1",
            device_cost="0.100001", tokens=(100, 40, 7)),
        row(acme["id"], "alpha", DAY + timedelta(hours=2), "0.333334", request_id="w2"),
        row(acme["id"], "beta", DAY + timedelta(days=1), "0.005", request_id="w3"),
        row(globex["id"], "beta", DAY + timedelta(hours=4), "12345.678901", request_id="w4",
            device_cost="20000"),
    ]  # fmt: skip

    async def write() -> None:
        async with services_of(cp.app).database.session() as session:
            models = await add_models(session, ["alpha", "beta"])
            await insert_rows(session, entries, models)

    await cp.in_app(write)
    return acme, acme_key, globex, globex_key


def _data_value(html: str, element_id: str) -> str:
    match = re.search(rf'id="{element_id}" data-value="([^"]+)"', html)
    assert match is not None, element_id
    return match.group(1)


def _chart_points(html: str, chart: str, series: str) -> dict[str, str]:
    svg = re.search(rf'<svg[^>]*data-chart="{chart}".*?</svg>', html, re.S)
    assert svg is not None, chart
    group = re.search(rf'<g class="series [^"]*" data-series="{series}">(.*?)</g>', svg.group(0))
    assert group is not None, series
    return dict(re.findall(r'data-bucket="([^"]+)" data-value="([^"]+)"', group.group(1)))


async def test_page_csv_and_charts_equal_the_api(cp: ControlPlane) -> None:
    acme, _, _, _ = await seed(cp)
    await sign_in(cp.client, cp.admin_secret)
    for filters in (PERIOD, {**PERIOD, "tenant_id": acme["id"]}, {**PERIOD, "model": "beta"}):
        api_csv = await cp.client.get(
            "/admin/reports/costs", params={**filters, "format": "csv"}, headers=cp.admin
        )
        page_csv = await cp.client.get("/ui/reports/costs.csv", params=filters)
        assert page_csv.status_code == 200
        assert page_csv.content == api_csv.content
        assert page_csv.headers["content-disposition"] == api_csv.headers["content-disposition"]

        api = (await cp.client.get("/admin/reports/costs", params=filters, headers=cp.admin)).json()
        page = await cp.client.get("/ui/reports/costs", params=filters)
        assert page.status_code == 200
        assert _data_value(page.text, "total-requests") == str(api["totals"]["requests"])
        assert _data_value(page.text, "total-charged") == api["totals"]["charged"]
        for r in api["data"]:
            assert r["charged"] in page.text and r["device_cost"] in page.text
        charged = _chart_points(page.text, "cost", "charged")
        requests = _chart_points(page.text, "requests", "requests")
        assert list(charged) == ["2026-03-04", "2026-03-05", "2026-03-06"]  # empty days too
        for day in charged:
            rows = [r for r in api["data"] if r["bucket"].startswith(day)]
            assert int(requests[day]) == sum(r["requests"] for r in rows)
            expected = sum((Decimal(r["charged"]) for r in rows), Decimal(0))
            assert Decimal(charged[day]) == expected


async def test_page_csv_link_carries_the_filters(cp: ControlPlane) -> None:
    acme, _, _, _ = await seed(cp)
    await sign_in(cp.client, cp.admin_secret)
    page = await cp.client.get("/ui/reports/costs", params={**PERIOD, "tenant_id": acme["id"]})
    link = re.search(r'id="csv-link" href="([^"]+)"', page.text)
    assert link is not None
    href = link.group(1).replace("&amp;", "&")
    assert f"tenant_id={acme['id']}" in href and "since=2026-03-04" in href
    csv = await cp.client.get(href)
    assert csv.status_code == 200 and acme["id"] in csv.text and "12345.678901" not in csv.text


async def test_bad_filters_show_a_message_not_a_500(cp: ControlPlane) -> None:
    await sign_in(cp.client, cp.admin_secret)
    for params, message in (
        ({"since": "yesterday"}, "since must be an ISO date"),
        ({"since": "2026-03-06", "until": "2026-03-01"}, "since must be earlier than until"),
        ({"group_by": "week"}, "group_by must be"),
        ({"since": "2020-01-01", "until": "2026-03-01", "group_by": "hour"}, "covers at most"),
    ):
        response = await cp.client.get("/ui/reports/costs", params=params)
        assert response.status_code == 400, params
        assert message in response.text and 'role="alert"' in response.text
    csv = await cp.client.get("/ui/reports/costs.csv", params={"since": "nope"})
    assert csv.status_code == 400 and "text/html" in csv.headers["content-type"]


async def test_tenant_sees_its_own_usage_only(cp: ControlPlane) -> None:
    acme, acme_key, globex, _ = await seed(cp)
    response = await sign_in(cp.client, acme_key)
    assert response.status_code == 303
    assert response.headers["location"] == f"/ui/tenants/{acme['id']}/usage"
    own = await cp.client.get(f"/ui/tenants/{acme['id']}/usage", params=PERIOD)
    assert own.status_code == 200
    assert _data_value(own.text, "total-requests") == "3"
    assert "12345.678901" not in own.text and "globex" not in own.text
    assert "Device cost" not in own.text  # the platform's own cost is not the tenant's business
    api_usage = await cp.client.get(
        "/v1/usage",
        params={**PERIOD, "format": "csv"},
        headers={"authorization": f"Bearer {acme_key}"},
    )
    page_csv = await cp.client.get(f"/ui/tenants/{acme['id']}/usage.csv", params=PERIOD)
    assert page_csv.status_code == 200 and page_csv.content == api_usage.content

    # Another tenant's pages: 404, existence not revealed; admin pages: 403.
    for path in (
        f"/ui/tenants/{globex['id']}/usage",
        f"/ui/tenants/{globex['id']}/usage.csv",
        f"/ui/tenants/{globex['id']}",
        "/ui/tenants/ten_does_not_exist/usage",
    ):
        other = await cp.client.get(path)
        assert other.status_code == 404, path
        assert "globex" not in other.text
    for path in ("/ui/reports/costs", "/ui/reports/costs.csv", "/ui/tenants", "/ui/models"):
        assert (await cp.client.get(path)).status_code == 403, path
    own_detail = await cp.client.get(f"/ui/tenants/{acme['id']}")
    assert own_detail.status_code == 303  # a tenant's own record page is its usage


async def test_suspending_a_tenant_ends_its_web_session(cp: ControlPlane) -> None:
    acme, acme_key, _, _ = await seed(cp)
    await sign_in(cp.client, acme_key)
    assert (await cp.client.get(f"/ui/tenants/{acme['id']}/usage")).status_code == 200
    suspended = await cp.client.post(f"/admin/tenants/{acme['id']}/suspend", headers=cp.admin)
    assert suspended.status_code == 200
    assert (await cp.client.get(f"/ui/tenants/{acme['id']}/usage")).status_code == 303


async def test_admin_sees_any_tenants_usage_page(cp: ControlPlane) -> None:
    acme, _, globex, _ = await seed(cp)
    await sign_in(cp.client, cp.admin_secret)
    for tenant, requests in ((acme, "3"), (globex, "1")):
        page = await cp.client.get(f"/ui/tenants/{tenant['id']}/usage", params=PERIOD)
        assert page.status_code == 200
        assert _data_value(page.text, "total-requests") == requests


async def test_sign_in_returns_to_the_page_asked_for(cp: ControlPlane) -> None:
    first = await cp.client.get("/ui/models")
    assert first.headers["location"] == "/ui/sign-in?next=/ui/models"
    form = await cp.client.get(first.headers["location"])
    token = re.search(r'name="csrf_token" value="([0-9a-f]{64})"', form.text)
    assert token is not None and 'name="next" value="/ui/models"' in form.text
    response = await cp.client.post(
        "/ui/sign-in",
        data={"api_key": cp.admin_secret, "next": "/ui/models", "csrf_token": token.group(1)},
    )
    assert response.headers["location"] == "/ui/models"


def _page_rows(html: str) -> list[tuple[str, str, str]]:
    """(group, requests, charged) of each row of the page's report table."""
    table = re.search(r'<table id="report-table">.*?</table>', html, re.S)
    assert table is not None
    return re.findall(
        r'data-col="group">([^<]*)</td>\s*<td class="num" data-col="requests">(\d+)</td>'
        r'.*?data-col="charged">([^<]+)</td>',
        table.group(0),
        re.S,
    )


async def test_pages_and_csv_split_by_key_project_user_and_tag_as_the_api(
    cp: ControlPlane,
) -> None:
    """The `by` filter on the admin cost page and on a tenant's usage page: one row per
    attribution value (and "(none)" for entries without it), as `/admin/reports/costs` and
    `/v1/usage` group them, and the page's CSV is the API's."""
    from sqlalchemy import update

    from hydrant.platform.db.models import LedgerEntry

    acme, acme_key, _, _ = await seed(cp)
    key, _ = await cp.create_key(acme["id"])
    project = await cp.client.post(
        f"/admin/tenants/{acme['id']}/projects", json={"name": "web"}, headers=cp.admin
    )
    assert project.status_code == 201, project.text
    attribution = {  # w3 stays unattributed
        "w1": {"tags": {"team": "search"}, "end_user": "u" * 64, "project_id": project.json()["id"],
               "api_key_id": key["id"]},
        "w2": {"tags": {"team": "ads"}, "end_user": "v" * 64},
    }  # fmt: skip
    for request_id, values in attribution.items():
        await cp.execute(
            update(LedgerEntry).where(LedgerEntry.request_id == request_id).values(**values)
        )

    expected_groups = {
        "tag:team": {"search", "ads", None},
        "user": {"u" * 64, "v" * 64, None},
        "project": {project.json()["id"], None},
        "key": {key["id"], None},
    }
    tenant = {"tenant_id": acme["id"]}
    await sign_in(cp.client, cp.admin_secret)
    for by, groups in expected_groups.items():
        params = {**PERIOD, **tenant, "by": by}
        api = (await cp.client.get("/admin/reports/costs", params=params, headers=cp.admin)).json()
        assert {r["group"] for r in api["data"]} == groups, by
        page = await cp.client.get("/ui/reports/costs", params=params)
        assert page.status_code == 200, page.text
        shown = _page_rows(page.text)
        assert len(shown) == len(api["data"]) > 1, by
        assert {(g, int(n), c) for g, n, c in shown} == {
            (r["group"] if r["group"] is not None else "(none)", r["requests"], r["charged"])
            for r in api["data"]
        }, by
        api_csv = await cp.client.get(
            "/admin/reports/costs", params={**params, "format": "csv"}, headers=cp.admin
        )
        page_csv = await cp.client.get("/ui/reports/costs.csv", params=params)
        assert page_csv.content == api_csv.content and b"group" in page_csv.content, by

    await sign_in(cp.client, acme_key)  # the tenant's own page, as /v1/usage splits it
    for by in ("tag:team", "project"):
        params = {**PERIOD, "by": by}
        usage = await cp.client.get(
            "/v1/usage", params=params, headers={"authorization": f"Bearer {acme_key}"}
        )
        own = await cp.client.get(f"/ui/tenants/{acme['id']}/usage", params=params)
        assert own.status_code == 200, own.text
        assert len({r["group"] for r in usage.json()["data"]}) > 1, by
        assert {(g, int(n), c) for g, n, c in _page_rows(own.text)} == {
            (r["group"] if r["group"] is not None else "(none)", r["requests"], r["charged"])
            for r in usage.json()["data"]
        }, by
        page_csv = await cp.client.get(f"/ui/tenants/{acme['id']}/usage.csv", params=params)
        usage_csv = await cp.client.get(
            "/v1/usage",
            params={**params, "format": "csv"},
            headers={"authorization": f"Bearer {acme_key}"},
        )
        assert page_csv.content == usage_csv.content, by
