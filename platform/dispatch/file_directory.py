"""The worker registry as a directory: one JSON file per worker, for engines on this machine.

The embedded default has no Redis, yet its engine runs in a child process that
`hydrant serve` dispatches to like any pool worker. The child registers by
writing its `WorkerRecord` to `<directory>/<worker_id>.json`, replaced
atomically at each heartbeat (hydrant.engine.worker.registration's
`DirectoryRegistryStore`); this is the gateway's read side, with the same
interface as the Redis `WorkerDirectory`.

A record leaves when its heartbeat is older than the TTL (a worker that hangs
or was stopped), or at once when its process is gone (the directory is local,
so the pid it carries is one of this machine's): a killed child is out of the
pool at the next poll, not a TTL later. Leaving means the file is removed, so
the next reader does not judge it again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from hydrant.engine.worker.wire import WorkerRecord, record_decoder

log = logging.getLogger(__name__)

RECORD_GLOB = "*.json"  # temporary files are dot-named `.….tmp`: never matched


def process_alive(pid: int) -> bool:
    """True while `pid` runs on this machine (a zombie, exited but not reaped, is gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no procfs (not Linux): the signal check is all there is
        return True
    # `pid (comm) S …`: the state follows the last parenthesis (comm may contain any).
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _remove_if_unchanged(file: Path, raw: bytes) -> None:
    """Remove a record judged gone, unless a heartbeat replaced it since it was read."""
    with contextlib.suppress(FileNotFoundError):
        if file.read_bytes() == raw:
            file.unlink(missing_ok=True)


class FileWorkerDirectory:
    def __init__(
        self,
        path: Path,
        ttl_s: float,
        *,
        clock: Callable[[], float] = time.time,
        alive: Callable[[int], bool] = process_alive,
    ) -> None:
        self.path = path
        self.ttl_s = ttl_s
        self.clock = clock
        self.alive = alive

    def records(self) -> list[WorkerRecord]:
        """Every live record, removing the files of workers that stopped or died."""
        if not self.path.is_dir():
            return []
        now = self.clock()
        live: list[WorkerRecord] = []
        for file in sorted(self.path.glob(RECORD_GLOB)):
            try:
                raw = file.read_bytes()
            except FileNotFoundError:  # deregistered between the listing and the read
                continue
            try:
                record = record_decoder.decode(raw)
            except msgspec.DecodeError:
                log.warning("unreadable worker record", extra={"file": file.name})
                continue
            expired = now - record.heartbeat_at > self.ttl_s
            if expired or (record.pid and not self.alive(record.pid)):
                _remove_if_unchanged(file, raw)
                continue
            live.append(record)
        return live

    async def workers(self, model: str) -> list[WorkerRecord]:
        """The model's live workers. A handful of small local files: read on the loop."""
        return [r for r in self.records() if r.model == model]

    async def models(self) -> list[str]:
        return sorted({r.model for r in self.records()})

    async def aclose(self) -> None:
        return None
