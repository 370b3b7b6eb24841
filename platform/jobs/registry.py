"""Every job by name, and the periodic schedule: one list for Celery beat and the embedded loop."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
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


# Digests and alerts are checked every few minutes, not once at the hour: the check
# sends only what is due and not yet claimed, so a tick missed (beat or gateway down)
# is caught up by the next one, and extra ticks cost one query.
PERIODIC: tuple[Periodic, ...] = (
    Periodic("daily-digests", "hydrant.digests.dispatch", 300.0),
    Periodic("budget-alerts", "hydrant.budgets.check", 300.0),
    Periodic("hourly-ledger-rollups", "hydrant.ledger.rollup", 3600.0),
    Periodic("stored-responses-purge", "hydrant.responses.purge", 3600.0),
    # The gateway replays its own spool every few seconds; this is for one that stopped.
    Periodic("spool-replay", "hydrant.ledger.replay_spool", 60.0, embedded=False),
    # Pools exist only with Redis, where Celery beat runs this; a gateway with pools also
    # scales its own down in its idle loop (the same `scale_down`), so nothing is lost
    # on the embedded default, which has no worker registry to read.
    Periodic("scale-to-zero-reaper", "hydrant.pools.reap", 60.0, embedded=False),
)


@cache
def all_jobs() -> dict[str, Job]:
    from hydrant.platform.digests.tasks import TASKS as DIGEST_TASKS
    from hydrant.platform.dispatch.tasks import TASKS as POOL_TASKS
    from hydrant.platform.jobs.tasks import TASKS as LEDGER_TASKS

    return {job.name: job for job in (*DIGEST_TASKS, *LEDGER_TASKS, *POOL_TASKS)}


def job_named(name: str) -> Job:
    try:
        return all_jobs()[name]
    except KeyError:
        raise KeyError(f"no job named {name!r}") from None
