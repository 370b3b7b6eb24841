"""`hydrant preflight` against a real `hydrant serve` process (embedded default, demo model).

Two servers: one configured so its limits fit (every applicable check must
pass, the pool-only checks are SKIP), one with the field's trap (256 sequences
configured over a KV pool that holds a fraction of them), where the capacity
check must FAIL and the command must exit non-zero.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from hydrant_server import RunningServer, hydrant_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

POOL_ONLY = {"cold start", "rollback drill"}

RULES = """\
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata: {name: hydrant}
spec:
  groups:
    - name: hydrant
      rules:
        - alert: HydrantKVCacheFull
          expr: max by (model) (hydrant_kv_cache_usage_perc) > 0.95
          for: 2m
          labels: {severity: P1}
        - alert: HydrantSpoolGrowing
          expr: hydrant_ledger_spool_entries > 0
          labels: {severity: P2}
        - record: hydrant:ttft_p99
          expr: histogram_quantile(0.99, rate(hydrant_time_to_first_token_seconds_bucket[5m]))
"""


def preflight(server: RunningServer, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "hydrant.cli", "preflight", "--url", server.base_url]
    return subprocess.run(
        [*command, *args],
        env={**os.environ, "HYDRANT_PREFLIGHT_ADMIN_KEY": server.admin_key},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_preflight_passes_on_a_well_configured_server(tmp_path: Path, demo_model_dir: Path) -> None:
    infra = tmp_path / "infra"
    infra.mkdir()
    (infra / "rules.yaml").write_text(RULES)
    data = tmp_path / "data"
    data.mkdir()
    # 64 MiB of KV = 2048 blocks of 16; the long prompts (~1 k tokens) take 65 each: 31 fit.
    env = {"HYDRANT_KV_CACHE_BYTES": str(64 * 2**20), "HYDRANT_MAX_NUM_SEQS": "24"}
    with hydrant_server(data, demo_model_dir, env=env) as server:
        # On a shared 2-core CPU one 1 k-token prefill step takes most of a second, so the
        # long-tail bound is widened here; its default (3x) is for real devices.
        result = preflight(
            server,
            "--json",
            "--log-file",
            str(server.log_file),
            "--infra",
            str(infra),
            "--tail-factor",
            "30",
        )
        assert result.returncode == 0, result.stdout + result.stderr
        report = json.loads(result.stdout)
        statuses = {c["name"]: c["status"] for c in report["checks"]}
        assert report["ok"] is True
        assert {n for n, s in statuses.items() if s == "SKIP"} == POOL_ONLY
        assert all(s == "PASS" for n, s in statuses.items() if n not in POOL_ONLY), statuses
        assert len(statuses) == 11
        for check in report["checks"]:
            if check["status"] == "PASS":
                assert check["measured"] not in ("", "-"), check
        assert "[1/10] dynamic batching" in result.stderr  # progress, on stderr

        with server.admin() as admin:
            tenants = admin.get("/admin/tenants", params={"limit": 100}).json()["data"]
            # the engine runs in a child process: its stats reach the gateway with its next
            # heartbeat, so blocks of preflight's last requests may still read as held
            for _ in range(50):
                engines = admin.get("/admin/engines").json()["data"]
                if engines[0]["num_free_blocks"] == engines[0]["num_total_blocks"]:
                    break
                time.sleep(0.1)
        preflight_tenants = [t for t in tenants if t["name"].startswith("preflight-")]
        assert len(preflight_tenants) == 1
        assert preflight_tenants[0]["status"] == "suspended"  # its key serves nothing more
        assert engines[0]["max_num_seqs"] == 24
        assert engines[0]["num_free_blocks"] == engines[0]["num_total_blocks"] == 2048
        assert engines[0]["observed"]["samples"] > 100

        repo_infra = Path(__file__).resolve().parents[2] / "infra"
        if repo_infra.is_dir():  # the repository's own rules and dashboards, against a live server
            only = "metrics completeness,alert thresholds"
            real = preflight(server, "--json", "--infra", str(repo_infra), "--only", only)
            checks = json.loads(real.stdout)["checks"]
            assert real.returncode == 0, checks
            assert [c["status"] for c in checks] == ["PASS", "PASS"], checks

        _, key = server.tenant_key("not-an-admin")
        refused = httpx.get(
            f"{server.base_url}/admin/engines", headers={"Authorization": f"Bearer {key}"}
        )
        assert refused.status_code in (401, 403)


def test_preflight_fails_when_max_num_seqs_cannot_fit(tmp_path: Path, demo_model_dir: Path) -> None:
    """256 sequences configured (the default) over 32 MiB of KV: 1024 blocks."""
    data = tmp_path / "data"
    data.mkdir()
    token = "preflight-scrape-token-0123456789"
    env = {
        "HYDRANT_KV_CACHE_BYTES": str(32 * 2**20),
        "HYDRANT_MAX_NUM_SEQS": "256",
        "HYDRANT_METRICS_TOKEN": token,  # and its /metrics wants a scrape token
    }
    with hydrant_server(data, demo_model_dir, env=env) as server:
        table = preflight(server, "--only", "capacity sanity,cold start")
        assert table.returncode == 1, table.stdout + table.stderr
        lines = {line.split("  ")[0]: line for line in table.stdout.splitlines()}
        assert "FAIL" in lines["capacity sanity"]
        assert "max_num_seqs 256" in lines["capacity sanity"]
        assert "SKIP" in lines["cold start"]
        assert "0 passed, 1 failed, 1 skipped" in table.stdout
        assert "set max_num_seqs <=" in table.stdout
        assert "not applicable: no worker pools" in table.stdout

        unknown = preflight(server, "--only", "warp drive")
        assert unknown.returncode == 2
        assert "unknown checks: warp drive" in unknown.stderr

        only = ("--json", "--only", "metrics completeness")
        [no_token] = json.loads(preflight(server, *only).stdout)["checks"]
        assert no_token["status"] == "FAIL" and "--metrics-token" in no_token["detail"]
        with_token = preflight(server, *only, "--metrics-token", token)
        [check] = json.loads(with_token.stdout)["checks"]
        assert check["status"] == "PASS", check


def test_preflight_refuses_a_wrong_admin_key(tmp_path: Path, demo_model_dir: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with hydrant_server(data, demo_model_dir) as server:
        server.admin_key = "hyd_test_" + "x" * 40
        result = preflight(server)
        assert result.returncode == 2
        assert "admin key was refused" in result.stderr
