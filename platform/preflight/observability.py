"""Checks of what operators see: metrics the alerts need, the alert thresholds, redacted logs.

The alert rules (a PrometheusRule) and the Grafana dashboard live in the
repository's `infra/` folder, not in the deployment, so they are read from
disk (`--infra DIR`); every metric they name must be in the live `/metrics`.
A dashboard or a rule that queries a metric nobody exports shows a flat line
and never fires: that is the failure this check exists for.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from pathlib import Path
from typing import Any

import yaml

from hydrant.platform.preflight.metrics_text import names_in
from hydrant.platform.preflight.options import PreflightOptions
from hydrant.platform.preflight.report import CheckResult
from hydrant.platform.preflight.session import PreflightSession

# Exported by every gateway with an engine; checked even where no infra files are found.
CORE_METRICS = frozenset(
    {
        "hydrant_gateway_requests",
        "hydrant_kv_cache_usage_perc",
        "hydrant_num_requests_running",
        "hydrant_num_requests_waiting",
        "hydrant_batch_tokens_per_step",
        "hydrant_time_to_first_token_seconds",
        "hydrant_ledger_spool_entries",
    }
)
# Names of metrics only worker pools export; not expected from an embedded deployment.
POOL_ONLY = re.compile(r"_(pool|pools|worker|workers|dispatch)(_|$)")
KV_METRIC = "hydrant_kv_cache_usage_perc"
P1_SEVERITIES = frozenset({"p1", "critical", "page"})
COMPARISON = re.compile(r">=?\s*(0?\.\d+|1(?:\.0+)?)\b")


def infra_files(infra_dir: Path | None) -> list[Path]:
    """Rule and dashboard files: YAML and JSON under the infra folder."""
    root = infra_dir if infra_dir is not None else Path("infra")
    if not root.is_dir():
        return []
    return sorted(
        p for p in root.rglob("*") if p.is_file() and p.suffix in {".yaml", ".yml", ".json"}
    )


def referenced_metrics(files: list[Path]) -> dict[str, set[str]]:
    """Metric name → the files that use it (only files that mention a Hydrant metric)."""
    used: dict[str, set[str]] = {}
    for path in files:
        for name in names_in(path.read_text(encoding="utf-8", errors="replace")):
            used.setdefault(name, set()).add(path.name)
    return used


async def check_metrics_complete(
    s: PreflightSession, o: PreflightOptions, has_pools: bool
) -> CheckResult:
    name = "metrics completeness"
    scrape = await s.scrape()
    used = referenced_metrics(infra_files(o.infra_dir))
    wanted = set(CORE_METRICS) | set(used)
    if not has_pools:
        wanted = {m for m in wanted if not POOL_ONLY.search(m)}
    missing = sorted(m for m in wanted if not scrape.has(m))
    source = f"{len(used)} from infra/ + core" if used else "core list (no infra/ files found)"
    measured = f"{len(wanted) - len(missing)}/{len(wanted)} exported"
    detail = (
        ""
        if not missing
        else "missing: "
        + ", ".join(f"{m} ({', '.join(sorted(used.get(m, {'core'})))})" for m in missing)
    )
    return CheckResult.judge(name, not missing, f"all used metrics ({source})", measured, detail)


def kv_alert_rules(files: list[Path]) -> list[dict[str, Any]]:
    """Every alerting rule of the PrometheusRule/rule files whose expression reads KV usage."""
    found = []
    for path in files:
        if path.suffix not in {".yaml", ".yml"}:
            continue
        try:
            documents = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
        except yaml.YAMLError:
            continue
        for document in documents:
            for rule in _rules_of(document):
                if "alert" in rule and KV_METRIC in str(rule.get("expr", "")):
                    found.append({**rule, "_file": path.name})
    return found


def _rules_of(document: Any) -> list[dict[str, Any]]:
    if not isinstance(document, dict):
        return []
    spec = document.get("spec", document)  # a PrometheusRule, or a plain rule file
    groups = spec.get("groups", []) if isinstance(spec, dict) else []
    return [
        rule
        for group in groups
        if isinstance(group, dict)
        for rule in group.get("rules", []) or []
        if isinstance(rule, dict)
    ]


def alert_threshold(rule: dict[str, Any]) -> float | None:
    match = COMPARISON.search(str(rule.get("expr", "")).split(KV_METRIC, 1)[-1])
    return float(match.group(1)) if match else None


async def check_alert_thresholds(s: PreflightSession, o: PreflightOptions) -> CheckResult:
    name = "alert thresholds"
    threshold = f"KV usage P1 at {o.kv_alert_threshold:g}"
    files = infra_files(o.infra_dir)
    rules = kv_alert_rules(files)
    if not files:
        return CheckResult.skip(name, threshold, "no infra/ rule files found (pass --infra DIR)")
    if not rules:
        return CheckResult.judge(
            name, False, threshold, "no rule", f"no alert in infra/ reads {KV_METRIC}"
        )
    shown = []
    good = False
    for rule in rules:
        value = alert_threshold(rule)
        severity = str((rule.get("labels") or {}).get("severity", "")).lower()
        shown.append(f"{rule['alert']} > {value} ({severity or 'no severity'})")
        if value is not None and abs(value - o.kv_alert_threshold) < 1e-9:
            good = good or severity in P1_SEVERITIES
    detail = "" if good else f"no P1/critical rule at {o.kv_alert_threshold:g}"
    return CheckResult.judge(name, good, threshold, "; ".join(shown), detail)


def find_canaries(log_text: str, canaries: dict[str, str]) -> list[str]:
    """Which canaries (by label) appear in the log text."""
    return [label for label, value in canaries.items() if value in log_text]


async def check_log_redaction(s: PreflightSession, o: PreflightOptions) -> CheckResult:
    name = "log redaction"
    threshold = "0 canaries in the log"
    if o.log_file is None:
        return CheckResult.skip(name, threshold, "no --log-file given: cannot scan the logs")
    prompt_canary = f"canary prompt {secrets.token_hex(8)}"
    fake_key = f"hyd_live_{secrets.token_hex(16)}"
    canaries = {
        "prompt text": prompt_canary,
        "refused key": fake_key,
        "preflight key": s.key,
        "preflight key secret part": s.key.rsplit("_", 1)[-1],
    }
    await s.chat(f"{prompt_canary} in a chat message")
    await s.complete(f"{prompt_canary} in a completion", 4)
    await s.chat("a request with a key that does not exist", key=fake_key)
    await asyncio.sleep(1.0)  # let the server's log handler write what it has
    if not o.log_file.is_file():
        return CheckResult.judge(name, False, threshold, "-", f"{o.log_file} does not exist")
    text = o.log_file.read_text(encoding="utf-8", errors="replace")
    found = find_canaries(text, canaries)
    measured = f"{len(found)} found in {len(text.splitlines())} lines"
    detail = "" if not found else "leaked: " + ", ".join(found)
    return CheckResult.judge(name, not found, threshold, measured, detail)
