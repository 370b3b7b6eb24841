"""Scaling an idle pool to zero: the one code path of the gateway's idle loop and the reaper job.

Two callers decide *that* a pool is idle from different vantage points: a
gateway's `WorkerPool` (its own requests, plus what the registry says of the
others') and the scale-to-zero reaper (the registry alone, for every gateway
at once, e.g. when the gateway that used the pool is gone). Both then ask
`idle_past()` and call `scale_down()`, so what "idle" and "scaled down" mean
cannot drift between them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Protocol

from hydrant.engine.worker.wire import WorkerRecord
from hydrant.platform.dispatch.scaler import PoolSpec, Scaler
from hydrant.platform.dispatch.worker_http import WorkerUnavailable

log = logging.getLogger(__name__)


class ControlCalls(Protocol):
    sleep_path: str  # `/sleep` (a worker), `/sleep?level=1` (vLLM)

    async def call(
        self, address: str, method: str, path: str, body: object = None, timeout_s: float = 30.0
    ) -> object: ...


def idle_past(records: Iterable[WorkerRecord], timeout_s: float, now: float) -> bool:
    """No request on any of these workers, from any gateway, for `timeout_s` (wall clock).

    The records come from the workers' heartbeats: `inflight` counts every
    gateway's requests and `idle_since` is when the last one ended. An upstream
    member's record has neither (its health check writes it): the requests its
    server reports running or waiting stand for every gateway's there.
    """
    for record in records:
        if record.inflight > 0:
            return False
        if record.stats is not None and record.stats.num_running + record.stats.num_waiting > 0:
            return False
        if record.idle_since is not None and now - record.idle_since < timeout_s:
            return False
    return True


async def scale_down(
    spec: PoolSpec,
    ready: Sequence[WorkerRecord],
    mode: str,
    http: ControlCalls,
    scaler: Scaler,
) -> list[str]:
    """Put the pool's ready workers to sleep, or stop them (`mode` "exit"); the ids that went.

    Sleep keeps the weights in host memory for a fast wake. Exit asks the
    scaler for zero workers (a Deployment scaled to 0, the gateway's own child
    processes stopped) and also asks each worker to drain and exit, which
    covers workers the scaler does not own (started by another gateway or an
    operator): the drain is the same one SIGTERM starts, so asking twice is
    harmless. An upstream member (vLLM) is never called on exit: it has no
    `/drain` (the workload's SIGTERM is its graceful stop) and must not see the
    worker secret; it sleeps through its own client (`UpstreamHttp`), with the
    upstream's control key.
    """
    gone: list[str] = []
    if mode == "sleep":
        for record in ready:
            try:
                await http.call(record.address, "POST", http.sleep_path, timeout_s=60.0)
                gone.append(record.worker_id)
            except WorkerUnavailable as exc:  # busy again, or away: the next check decides
                log.warning(
                    "worker did not sleep", extra={"model": spec.model, "error": exc.message}
                )
        return gone
    await scaler.scale(spec, 0)
    for record in ready:
        if record.kind != "hydrant":
            gone.append(record.worker_id)
            continue
        try:
            await http.call(record.address, "POST", "/drain", timeout_s=10.0)
        except WorkerUnavailable as exc:  # already stopping or gone
            log.info("worker not drained", extra={"model": spec.model, "error": exc.message})
        gone.append(record.worker_id)
    return gone
