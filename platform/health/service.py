"""Readiness checks: database reachable, schema at head, every model servable.

Each check reports its own status, so an operator reading `/readyz` sees which
part is not ready instead of a bare 503.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from hydrant.platform.db import migrate
from hydrant.platform.db.session import Database
from hydrant.platform.models.checkpoints import inspect_checkpoint
from hydrant.settings import ModelSpec


@runtime_checkable  # injected by name: Litestar checks an injected value against its type
class ModelRuntime(Protocol):
    """Whatever serves models in this process (an in-process engine, or worker pools)."""

    def model_state(self, name: str) -> str | None:
        """`loaded`, `loading`, `sleeping`, `failed`, or None when it does not hold the model."""
        ...


@dataclass
class CheckResult:
    name: str
    ok: bool
    detail: str


@dataclass
class Readiness:
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        return all(check.ok for check in self.checks)

    def as_json(self) -> dict[str, object]:
        return {
            "status": "ready" if self.ready else "not_ready",
            "checks": {c.name: {"ok": c.ok, "detail": c.detail} for c in self.checks},
        }


async def check_readiness(
    database: Database,
    models: Sequence[ModelSpec],
    runtime: ModelRuntime | None = None,
    timeout_s: float = 2.0,
) -> Readiness:
    readiness = Readiness()
    try:
        await asyncio.wait_for(database.ping(), timeout_s)
        readiness.checks.append(CheckResult("database", True, "reachable"))
        current = await asyncio.wait_for(migrate.current_revision(database.engine), timeout_s)
        head = migrate.head_revision()
        at_head = current == head
        detail = (
            f"at {current}" if at_head else f"at {current}, head is {head}: run hydrant migrate"
        )
        readiness.checks.append(CheckResult("migrations", at_head, detail))
    except (TimeoutError, OSError, Exception) as exc:  # any driver error means not ready
        readiness.checks.append(
            CheckResult("database", False, f"unreachable: {type(exc).__name__}")
        )
        readiness.checks.append(CheckResult("migrations", False, "unknown: database unreachable"))
    for spec in models:
        readiness.checks.append(await asyncio.to_thread(_model_check, spec, runtime))
    return readiness


def _model_check(spec: ModelSpec, runtime: ModelRuntime | None) -> CheckResult:
    name = f"model:{spec.name}"
    state = runtime.model_state(spec.name) if runtime is not None else None
    if state == "loaded":
        return CheckResult(name, True, "loaded")
    if state == "failed":
        return CheckResult(name, False, "failed to load (see the server log)")
    if state == "loading":  # the embedded default's engine process is starting
        return CheckResult(name, False, "loading")
    info = inspect_checkpoint(spec.path)
    if not info.loadable:
        return CheckResult(name, False, "; ".join(info.problems))
    return CheckResult(name, True, state or "loadable")
