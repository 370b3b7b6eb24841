"""A tenant's page lists its projects and makes keys in one: through the real services."""

from __future__ import annotations

import html
import re

from control_plane_helpers import ControlPlane
from web_helpers import post_form, sign_in


async def test_the_tenant_page_lists_projects_and_makes_a_key_in_one(cp: ControlPlane) -> None:
    assert (await sign_in(cp.client, cp.admin_secret)).status_code == 303
    tenant = await cp.create_tenant("acme")
    path = f"/ui/tenants/{tenant['id']}"
    assert "No projects: every key is tenant-level." in (await cp.client.get(path)).text
    made = await cp.client.post(
        f"/admin/tenants/{tenant['id']}/projects",
        json={"name": "web", "tokens_per_day": 5000},
        headers=cp.admin,
    )
    project = made.json()
    page = (await cp.client.get(path)).text
    row = re.search(rf'<tr data-project-id="{project["id"]}">(.*?)</tr>', page, re.S)
    assert row is not None and "web" in row.group(1) and "5000" in row.group(1)
    assert f'<option value="{project["id"]}">web</option>' in page

    created = await post_form(
        cp.client, f"{path}/keys", {"name": "ci", "project": project["id"]}, token_from=path
    )
    assert created.status_code == 303, created.text
    listing = (await cp.client.get(path)).text
    key_row = re.search(r'<tr data-key-id="key_[^"]+">(.*?)</tr>', listing, re.S)
    assert key_row is not None and "<td>web</td>" in key_row.group(1)


async def test_a_keys_budgets_are_shown_and_changed_on_the_tenant_page(cp: ControlPlane) -> None:
    assert (await sign_in(cp.client, cp.admin_secret)).status_code == 303
    tenant = await cp.create_tenant("acme")
    key, _ = await cp.create_key(tenant["id"], tokens_per_day=100)
    path = f"/ui/tenants/{tenant['id']}"

    def row_of(page: str) -> str:
        found = re.search(rf'<tr data-key-id="{key["id"]}">(.*?)</tr>', page, re.S)
        assert found is not None
        return found.group(1)

    assert "tokens/day 100" in row_of((await cp.client.get(path)).text)
    url = f"/ui/keys/{key['id']}/budgets"
    form = {"tokens_per_day": "", "tokens_per_month": "5000", "spend_per_day": "2.5",
            "spend_per_month": ""}  # fmt: skip
    saved = await post_form(cp.client, url, form, token_from=path)
    assert saved.status_code == 303 and saved.headers["location"].endswith("notice=budgets")
    page = (await cp.client.get(saved.headers["location"])).text
    assert "Key budgets changed" in page
    row = row_of(page)
    assert "tokens/month 5000" in row and "spend/day 2.500000" in row
    assert "tokens/day" not in row  # the blank field cleared it
    assert 'name="spend_per_day" value="2.500000"' in row  # the form shows what is set
    api = (await cp.client.get(f"/admin/keys/{key['id']}", headers=cp.admin)).json()
    assert (api["tokens_per_day"], api["tokens_per_month"], api["spend_per_day"]) == (
        None,
        5000,
        "2.500000",
    )

    bad = await post_form(cp.client, url, {**form, "spend_per_day": "-1"}, token_from=path)
    assert bad.status_code == 400
    assert "spend per day: must be a number such as 2.50" in html.unescape(bad.text)
    words = await post_form(cp.client, url, {**form, "tokens_per_month": "lots"}, token_from=path)
    assert words.status_code == 400 and "tokens per month" in html.unescape(words.text)
    after = (await cp.client.get(f"/admin/keys/{key['id']}", headers=cp.admin)).json()
    assert after == api  # nothing refused was applied
