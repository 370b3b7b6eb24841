"""A batch made with a key in a project: each line's ledger entry names that project,
as the same request made interactively with the key would (on SQLite and PostgreSQL)."""

from __future__ import annotations

from pathlib import Path

from batch_helpers import chat_line, gateway, jsonl


async def test_a_batchs_lines_are_attributed_to_its_keys_project(
    data_dir: Path, demo_model_dir: Path, database_url: str
) -> None:
    async with gateway(data_dir, demo_model_dir, database_url=database_url) as gw:
        tenant_id, _ = await gw.tenant("acme")
        admin = gw.auth(gw.admin)
        project = await gw.client.post(
            f"/admin/tenants/{tenant_id}/projects", json={"name": "etl"}, headers=admin
        )
        made = await gw.client.post(
            "/admin/keys", json={"tenant_id": tenant_id, "project": "etl"}, headers=admin
        )
        key = made.json()["secret"]
        created = await gw.create(key, jsonl([chat_line("a", "hi"), chat_line("b", "yo")]))
        assert created.status_code == 200, created.text
        done = await gw.wait(key, created.json()["id"])
        assert done["status"] == "completed", done
        entries = await gw.ledger(batch_id=done["id"])
        assert len(entries) == 2
        assert {e.project_id for e in entries} == {project.json()["id"]}
        assert {e.api_key_id for e in entries} == {made.json()["key"]["id"]}
