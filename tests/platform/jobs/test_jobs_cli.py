"""`hydrant jobs run`: one job now, in this process, on the embedded default (no Redis)."""

from __future__ import annotations

import email
import email.policy
import json
from pathlib import Path

from click.testing import CliRunner

from hydrant.cli.main import cli


def test_jobs_run_sends_due_digests_to_the_outbox(tmp_path: Path) -> None:
    env = {
        "HYDRANT_DATA_DIR": str(tmp_path),
        "HYDRANT_LOG_FORMAT": "text",
        "HYDRANT_ADMIN_DIGEST_TO": "boss@hydrant.test",
        "HYDRANT_ADMIN_DIGEST_HOUR": "0",  # due whatever the hour the test runs at
    }
    runner = CliRunner()
    assert runner.invoke(cli, ["migrate"], env=env).exit_code == 0

    result = runner.invoke(cli, ["jobs", "run", "hydrant.digests.dispatch"], env=env)

    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "tenant_digests": 0,
        "admin_digest": True,
        "stuck_sends": 0,
    }
    [eml] = (tmp_path / "outbox").glob("*.eml")  # the admin digest it enqueued ran too
    message = email.message_from_bytes(eml.read_bytes(), policy=email.policy.default)
    assert message["To"] == "boss@hydrant.test"
    assert "No usage" in str(message.get_body(("plain",)).get_content())  # type: ignore[union-attr]

    again = runner.invoke(cli, ["jobs", "run", "hydrant.digests.dispatch"], env=env)
    assert json.loads(again.stdout.strip().splitlines()[-1])["admin_digest"] is False
    assert len(list((tmp_path / "outbox").glob("*.eml"))) == 1


def test_jobs_run_refuses_unknown_jobs_and_bad_arguments(tmp_path: Path) -> None:
    env = {"HYDRANT_DATA_DIR": str(tmp_path), "HYDRANT_LOG_FORMAT": "text"}
    unknown = CliRunner().invoke(cli, ["jobs", "run", "hydrant.nope"], env=env)
    assert unknown.exit_code == 2 and "hydrant.digests.dispatch" in unknown.output
    bad = CliRunner().invoke(
        cli, ["jobs", "run", "hydrant.ledger.rollup", "--arg", "novalue"], env=env
    )
    assert bad.exit_code == 2 and "KEY=VALUE" in bad.output


def test_jobs_digest_shows_and_changes_a_tenants_digest(tmp_path: Path) -> None:
    env = {"HYDRANT_DATA_DIR": str(tmp_path), "HYDRANT_LOG_FORMAT": "text"}
    runner = CliRunner()
    assert runner.invoke(cli, ["migrate"], env=env).exit_code == 0
    assert runner.invoke(cli, ["tenants", "create", "acme"], env=env).exit_code == 0

    changed = runner.invoke(
        cli,
        [
            "jobs",
            "digest",
            "acme",
            "--to",
            "a@acme.test",
            "--hour",
            "6",
            "--timezone",
            "Asia/Tokyo",
        ],
        env=env,
    )
    assert changed.exit_code == 0, changed.output
    view = json.loads(changed.stdout)
    assert (view["recipients"], view["send_hour"], view["timezone"]) == (
        ["a@acme.test"],
        6,
        "Asia/Tokyo",
    )
    shown = runner.invoke(cli, ["jobs", "digest", "acme"], env=env)
    assert json.loads(shown.stdout) == view
    bad = runner.invoke(cli, ["jobs", "digest", "acme", "--timezone", "Nowhere/Else"], env=env)
    assert bad.exit_code == 2 and "IANA" in bad.output
    missing = runner.invoke(cli, ["jobs", "digest", "nobody"], env=env)
    assert missing.exit_code == 2 and "no tenant" in missing.output


def test_stuck_digests_lists_nothing_on_a_new_install_and_refuses_an_unknown_send(
    tmp_path: Path,
) -> None:
    env = {"HYDRANT_DATA_DIR": str(tmp_path), "HYDRANT_LOG_FORMAT": "text"}
    runner = CliRunner()
    assert runner.invoke(cli, ["migrate"], env=env).exit_code == 0
    listed = runner.invoke(cli, ["jobs", "stuck-digests"], env=env)
    assert listed.exit_code == 0, listed.output
    assert listed.stdout.strip() == ""
    unknown = runner.invoke(cli, ["jobs", "stuck-digests", "--resend", "dgs_nope"], env=env)
    assert unknown.exit_code == 2
    assert "no digest send 'dgs_nope'" in unknown.output
