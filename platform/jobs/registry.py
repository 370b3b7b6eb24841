"""A table of jobs by name with their periodic schedule: what Celery and the embedded loop run.

The table is handed in (`hydrant.platform.job_table.JOB_TABLE` lists every
domain's jobs), so this package names no domain and every domain's `tasks.py`
can use it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from hydrant.platform.jobs.context import Job


@dataclass(frozen=True)
class Periodic:
    """Run `job` every `every_s` seconds; `embedded` says whether the gateway's loop runs it too."""

    name: str
    job: str
    every_s: float
    embedded: bool = True
    kwargs: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class JobTable:
    """Every job by name, and which of them run periodically."""

    jobs: dict[str, Job] = field(default_factory=dict)
    periodic: tuple[Periodic, ...] = ()

    @classmethod
    def of(cls, jobs: Iterable[Job], periodic: tuple[Periodic, ...]) -> JobTable:
        table = cls({job.name: job for job in jobs}, periodic)
        for entry in periodic:
            table.job_named(entry.job)  # a schedule naming no job is a bug: fail at import
        return table

    def job_named(self, name: str) -> Job:
        try:
            return self.jobs[name]
        except KeyError:
            raise KeyError(f"no job named {name!r}") from None
