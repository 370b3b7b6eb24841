"""One check's result, and the table and JSON the command prints.

Every result carries the threshold it was held to and the value measured, so a
reader sees how close a PASS was and what a FAIL missed by, not just a verdict.
SKIP is neither: the check does not apply to this deployment (no worker pools)
or could not measure (no log file given); its detail says which.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    PASS = "PASS"  # noqa: S105 - a verdict, not a password
    FAIL = "FAIL"
    SKIP = "SKIP"


@dataclass
class CheckResult:
    name: str
    status: Status
    threshold: str
    measured: str
    detail: str = ""
    seconds: float = 0.0

    @classmethod
    def skip(cls, name: str, threshold: str, why: str) -> CheckResult:
        return cls(name, Status.SKIP, threshold, "-", why)

    @classmethod
    def judge(
        cls, name: str, ok: bool, threshold: str, measured: str, detail: str = ""
    ) -> CheckResult:
        return cls(name, Status.PASS if ok else Status.FAIL, threshold, measured, detail)


def failed(results: list[CheckResult]) -> bool:
    return any(r.status is Status.FAIL for r in results)


def as_json(url: str, results: list[CheckResult]) -> dict[str, Any]:
    return {
        "url": url,
        "ok": not failed(results),
        "checks": [{**asdict(r), "status": r.status.value} for r in results],
    }


def format_table(results: list[CheckResult]) -> str:
    """Fixed-width table; details (why a check failed or was skipped) below it."""
    header = ("check", "result", "threshold", "measured")
    rows = [(r.name, r.status.value, r.threshold, r.measured) for r in results]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    line = "  ".join("-" * w for w in widths)
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)), line]
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    notes = [f"{r.status.value} {r.name}: {r.detail}" for r in results if r.detail]
    passed = sum(r.status is Status.PASS for r in results)
    fails = sum(r.status is Status.FAIL for r in results)
    skips = sum(r.status is Status.SKIP for r in results)
    out += [line, f"{passed} passed, {fails} failed, {skips} skipped"]
    if notes:
        out += ["", *notes]
    return "\n".join(out)
