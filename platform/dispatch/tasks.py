"""Jobs of the worker pools: the scale-to-zero reaper (Celery beat, every minute)."""

from __future__ import annotations

from typing import Any

from hydrant.platform.dispatch.directory import WorkerDirectory
from hydrant.platform.dispatch.reaper import reap_idle_pools
from hydrant.platform.dispatch.service import make_scaler, upstream_scaling
from hydrant.platform.dispatch.worker_http import WorkerHttp
from hydrant.platform.jobs.context import Job, JobContext

REAP = "hydrant.pools.reap"


async def reap_pools(ctx: JobContext) -> dict[str, Any]:
    """Sleep (or stop, by `pool_scale_down`) the registry's pools idle past `pool_idle_timeout_s`.

    Nothing to do, not an error, where there is no worker registry: the
    embedded default has no pools. Redis being away fails the run; the next
    one (a minute later) is the retry, so no Celery retry is asked for.
    """
    settings = ctx.settings
    if not settings.redis_url or not settings.worker_secret:
        return {"skipped": "no worker registry (HYDRANT_REDIS_URL, HYDRANT_WORKER_SECRET)"}
    directory = WorkerDirectory.from_url(settings.redis_url, settings.worker_registry_prefix)
    http = WorkerHttp(settings.worker_secret)
    scaler = make_scaler(settings)  # for `exit`: a Deployment is scaled; local workers drain
    # upstream pools: their workloads with the kubernetes scaler, else left to KEDA
    upstream = upstream_scaling(settings)[0] if settings.pool_scaler == "kubernetes" else None
    try:
        reaped = await reap_idle_pools(
            directory,
            http,
            scaler,
            settings.pool_idle_timeout_s,
            settings.pool_scale_down,
            upstream=upstream,
            sleeping_upstreams=settings.upstream_sleep_models(),
        )
    finally:
        await scaler.close()
        await http.aclose()
        await directory.aclose()
    pools = [{"model": r.model, "mode": r.mode, "workers": list(r.workers)} for r in reaped]
    return {"pools": pools}


TASKS = (Job(REAP, reap_pools, retry_on=()),)
