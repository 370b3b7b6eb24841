"""The scale-to-zero reaper: idle pools of every gateway, from the worker registry alone.

A gateway scales its own pools down when they go idle, but only while it
runs and only for the models it serves: workers left by a gateway that
stopped, or shared by gateways that each see only their own traffic, are
the reaper's. It reads every pool in the registry and scales down those
whose ready workers have all been idle past the timeout, through the same
`idle_past`/`scale_down` the gateways use. Running it twice is harmless: a
pool already asleep has no ready worker left to act on.

Upstream pools (vLLM) are left to their own deployment unless an
`upstream` scaler is given (the kubernetes scaler): then an idle one has its
workload scaled to zero, as the gateway that serves it would; except those
whose members sleep (`HYDRANT_UPSTREAM_SLEEP`): their gateways put them to
sleep, and the workload stays up so that a wake takes seconds, not a pod's
start.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from hydrant.platform.dispatch.directory import WorkerDirectory
from hydrant.platform.dispatch.scale_down import ControlCalls, idle_past, scale_down
from hydrant.platform.dispatch.scaler import PoolSpec, Scaler

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reaped:
    model: str
    mode: str
    workers: tuple[str, ...]


async def reap_idle_pools(
    directory: WorkerDirectory,
    http: ControlCalls,
    scaler: Scaler,
    idle_timeout_s: float,
    mode: str,
    now: float | None = None,
    upstream: Scaler | None = None,
    sleeping_upstreams: frozenset[str] = frozenset(),
) -> list[Reaped]:
    """Scale down every registered pool idle past `idle_timeout_s`; what it scaled down."""
    if idle_timeout_s <= 0:
        return []
    moment = time.time() if now is None else now
    reaped: list[Reaped] = []
    for model in await directory.models():
        ready = [r for r in await directory.workers(model) if r.state == "ready"]
        members = [r for r in ready if r.kind != "hydrant"]
        ready = [r for r in ready if r.kind == "hydrant"]
        if (
            members
            and upstream is not None
            and model not in sleeping_upstreams
            and idle_past(members, idle_timeout_s, moment)
        ):
            # an upstream pool: its workload to zero (vLLM has no Hydrant sleep)
            spec = PoolSpec(model=model, path=members[0].path)
            log.info("reaper: upstream pool idle, scaling to zero", extra={"model": model})
            gone = await scale_down(spec, members, "exit", http, upstream)
            reaped.append(Reaped(model, "exit", tuple(gone)))
        if not ready or not idle_past(ready, idle_timeout_s, moment):
            continue
        revisions = {r.revision for r in ready}
        if len(revisions) > 1:  # a hot swap is under way: the gateway running it decides
            continue
        path, quantization = revisions.pop()
        spec = PoolSpec(model=model, path=path, quantization=quantization)
        log.info("reaper: pool idle, scaling to zero", extra={"model": model, "mode": mode})
        gone = await scale_down(spec, ready, mode, http, scaler)
        if gone:
            reaped.append(Reaped(model, mode, tuple(gone)))
    return reaped
