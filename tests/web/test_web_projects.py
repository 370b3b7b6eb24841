"""A tenant's page lists its projects and makes keys in one: through the real services."""

from __future__ import annotations

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
