"""`hydrant tenants …` / `hydrant keys …` through click against a SQLite data directory.

The commands are attached to a group of their own here (the lead swaps them
into `hydrant.cli.main`); they must work the same once there.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from hydrant.cli.admin import keys, tenants
from hydrant.cli.context import CliContext
from hydrant.platform.auth.key_codec import parse_key
from hydrant.platform.auth.service import Authenticator
from hydrant.platform.db import migrate
from hydrant.platform.db.session import Database
from hydrant.platform.server_secret import load_server_secret
from hydrant.settings import load_settings


@click.group()
@click.pass_context
def root(ctx: click.Context) -> None:
    ctx.obj = CliContext(config_file=None)


root.add_command(tenants)
root.add_command(keys)


@pytest.fixture(params=[True, False], ids=["auto-migrate", "migrated"])
def run(data_dir: Path, request: pytest.FixtureRequest):
    """Commands on a fresh data directory: migrated by the first command, or beforehand."""
    env = {"HYDRANT_DATA_DIR": str(data_dir), "HYDRANT_LOG_FORMAT": "text"}
    if not request.param:
        migrate.upgrade(load_settings({}, data_dir=data_dir).effective_database_url)
        env["HYDRANT_AUTO_MIGRATE"] = "false"

    def invoke(*args: str, ok: bool = True) -> Result:
        result = CliRunner().invoke(root, list(args), env=env)
        if ok:
            assert result.exit_code == 0, (args, result.output)
        return result

    return invoke


def _authenticate(data_dir: Path, secret: str, scope: str) -> object:
    """What a gateway on the same data directory would make of the key."""
    settings = load_settings({}, data_dir=data_dir)

    async def check() -> object:
        database = Database(settings.effective_database_url)
        try:
            authenticator = Authenticator(database, lambda: load_server_secret(settings))
            return await authenticator.authenticate(f"Bearer {secret}", scope)
        finally:
            await database.dispose()

    return asyncio.run(check())


def test_tenant_lifecycle(run) -> None:
    created = json.loads(
        run("tenants", "create", "acme", "--email", "ops@acme.io", "--json").stdout
    )
    assert created[0]["name"] == "acme" and created[0]["plan_id"] == "pln_default"
    run("tenants", "create", "beta")
    listing = run("tenants", "list").stdout.splitlines()
    assert listing[0].split("\t")[:3] == ["id", "name", "status"]
    assert [line.split("\t")[1] for line in listing[1:]] == ["acme", "beta"]

    updated = run("tenants", "update", "acme", "--timezone", "Asia/Tokyo", "--no-email", "--json")
    body = json.loads(updated.stdout)[0]
    assert (body["timezone"], body["contact_email"]) == ("Asia/Tokyo", None)
    assert "\tsuspended" in run("tenants", "suspend", "acme").output
    suspended = run("tenants", "list", "--status", "suspended").stdout.splitlines()[1:]
    assert [line.split("\t")[1] for line in suspended] == ["acme"]
    assert "\tactive" in run("tenants", "resume", created[0]["id"]).output
    shown = json.loads(run("tenants", "show", "acme").stdout)
    assert shown["plan"]["max_prompt_tokens"] == 8192

    duplicate = run("tenants", "create", "acme", ok=False)
    assert duplicate.exit_code == 1 and "exists" in duplicate.output
    bad = run("tenants", "create", "x", "--timezone", "Nowhere/Land", ok=False)
    assert bad.exit_code == 1 and "time zone" in bad.output
    missing = run("tenants", "show", "ghost", ok=False)
    assert missing.exit_code == 1 and "no tenant" in missing.output


def test_key_lifecycle_matches_what_the_gateway_accepts(run, data_dir: Path) -> None:
    run("tenants", "create", "acme")
    created = run("keys", "create", "--tenant", "acme", "--name", "ci")
    secret = created.stdout.strip()
    assert parse_key(secret).prefix in created.stderr  # details on stderr, secret alone on stdout
    principal = _authenticate(data_dir, secret, "inference")
    assert principal.tenant_id is not None  # type: ignore[attr-defined]

    admin = json.loads(run("keys", "create", "--admin", "--json").stdout)
    assert admin["key"]["scopes"] == ["admin"] and admin["key"]["tenant_id"] is None
    assert _authenticate(data_dir, admin["secret"], "admin").is_admin  # type: ignore[attr-defined]

    listed = json.loads(run("keys", "list", "--tenant", "acme", "--json").stdout)
    assert [k["name"] for k in listed] == ["ci"]
    assert secret not in run("keys", "list").output
    key_id = listed[0]["id"]

    rotated = json.loads(run("keys", "rotate", key_id, "--grace-seconds", "0", "--json").stdout)
    assert rotated["previous"]["status"] == "rotated"
    assert _authenticate(data_dir, rotated["secret"], "inference") is not None
    assert "revoked" in run("keys", "revoke", rotated["key"]["id"]).output
    from hydrant.platform.errors import AuthenticationFailed

    with pytest.raises(AuthenticationFailed):
        _authenticate(data_dir, rotated["secret"], "inference")


def test_key_create_needs_exactly_one_owner(run) -> None:
    for args in ((), ("--admin", "--tenant", "acme")):
        result = run("keys", "create", *args, ok=False)
        assert result.exit_code == 2 and "exactly one" in result.output
    unknown = run("keys", "revoke", "key_nope", ok=False)
    assert unknown.exit_code == 1 and "no API key" in unknown.output
