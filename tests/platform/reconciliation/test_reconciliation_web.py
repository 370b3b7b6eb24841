"""The admin cost page shows the day's reconciliation with the API's figures, and its CSV
download is the API's CSV byte for byte; signed out, neither is shown."""

from __future__ import annotations

import re

from control_plane_helpers import ControlPlane
from reconciliation_factories import PATH, seed
from web_helpers import sign_in

DAY = {"day": "2026-12-01"}


def cells(html: str, table: str) -> list[list[str]]:
    body = re.search(rf'<table id="{table}">.*?<tbody>(.*?)</tbody>', html, re.S)
    assert body is not None, table
    return [
        [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)]
        for tr in re.findall(r"<tr>(.*?)</tr>", body.group(1), re.S)
    ]


async def test_the_cost_page_shows_the_days_reconciliation(cp: ControlPlane) -> None:
    tenants = await seed(cp)
    signed_out = await cp.client.get(
        "/ui/reports/reconciliation.csv", params=DAY, follow_redirects=False
    )
    assert signed_out.status_code in (302, 303) and "sign-in" in signed_out.headers["location"]
    await sign_in(cp.client, cp.admin_secret)

    api = (await cp.client.get(PATH, params=DAY, headers=cp.admin)).json()
    page = await cp.client.get("/ui/reports/costs", params=DAY)
    assert page.status_code == 200, page.text
    (pool,) = cells(page.text, "reconciliation-pools")
    expected = api["pools"][0]
    assert pool[0] == "tiny" and pool[9] == "yes"
    assert pool[4:8] == [
        expected["held_cost"],
        expected["request_cost"],
        expected["idle_cost"],
        expected["load_cost"],
    ]
    lines = {row[0]: row for row in cells(page.text, "reconciliation-tenants")}
    assert set(lines) == {"a", "b"}  # tenant names, not ids
    for line in api["tenants"]:
        name = next(n for n, i in tenants.items() if i == line["tenant_id"])
        assert lines[name][3:] == [
            line["revenue"],
            line["device_cost"],
            line["idle_cost"],
            line["margin"],
        ]

    api_csv = await cp.client.get(PATH, params={**DAY, "format": "csv"}, headers=cp.admin)
    page_csv = await cp.client.get("/ui/reports/reconciliation.csv", params=DAY)
    assert page_csv.status_code == 200 and page_csv.content == api_csv.content
    bad = await cp.client.get("/ui/reports/costs", params={"day": "yesterday"})
    assert bad.status_code == 400 and "YYYY-MM-DD" in bad.text
