"""The directory registry of the embedded default's engine children, on a real filesystem.

The writer is the worker's own store (`DirectoryRegistryStore`), the reader the
gateway's (`FileWorkerDirectory`): records expire by heartbeat age or when
their process is gone, a heartbeat replaces the file atomically (a reader
racing a writer never sees half a record), and deregistering removes it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec

from hydrant.engine.worker.registration import DirectoryRegistryStore, RegistryTarget
from hydrant.engine.worker.wire import WorkerRecord
from hydrant.platform.dispatch.file_directory import FileWorkerDirectory, process_alive

NOW = 1_000_000.0


def record(
    worker_id: str, model: str = "demo", heartbeat_at: float = NOW, **kw: object
) -> WorkerRecord:
    kw.setdefault("pid", os.getpid())
    return WorkerRecord(
        worker_id=worker_id,
        model=model,
        address="http://127.0.0.1:1",
        device="cpu",
        state="ready",
        path="/models/demo",
        heartbeat_at=heartbeat_at,
        **kw,  # type: ignore[arg-type]
    )


def reader(path: Path, now: float = NOW, ttl_s: float = 5.0) -> FileWorkerDirectory:
    return FileWorkerDirectory(path, ttl_s, clock=lambda: now)


async def test_published_records_are_read_per_model(tmp_path: Path) -> None:
    store = DirectoryRegistryStore(tmp_path / "registry")  # made on first write
    await store.publish(record("a"), 5.0)
    await store.publish(record("b", model="other"), 5.0)
    directory = reader(tmp_path / "registry")
    assert [r.worker_id for r in await directory.workers("demo")] == ["a"]
    assert await directory.models() == ["demo", "other"]
    await store.remove(record("a"))
    assert await directory.workers("demo") == []
    assert [r.worker_id for r in await directory.workers("other")] == ["b"]


async def test_a_missing_directory_is_an_empty_registry(tmp_path: Path) -> None:
    assert await reader(tmp_path / "nothing").workers("demo") == []


async def test_a_record_older_than_the_ttl_leaves_and_its_file_is_removed(tmp_path: Path) -> None:
    store = DirectoryRegistryStore(tmp_path)
    await store.publish(record("fresh", heartbeat_at=NOW - 4.9), 5.0)
    await store.publish(record("stale", heartbeat_at=NOW - 5.1), 5.0)
    assert [r.worker_id for r in await reader(tmp_path).workers("demo")] == ["fresh"]
    assert not store.path_of("stale").exists()
    assert store.path_of("fresh").exists()
    # A new heartbeat brings it back (a worker that was only slow re-registers).
    await store.publish(record("stale", heartbeat_at=NOW), 5.0)
    assert len(await reader(tmp_path).workers("demo")) == 2


async def test_a_record_whose_process_is_gone_leaves_at_once(tmp_path: Path) -> None:
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()  # reaped: its pid is free
    store = DirectoryRegistryStore(tmp_path)
    await store.publish(record("dead", pid=exited.pid), 5.0)
    await store.publish(record("alive"), 5.0)
    assert [r.worker_id for r in await reader(tmp_path).workers("demo")] == ["alive"]
    assert not store.path_of("dead").exists()


def test_a_zombie_is_not_alive() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        stat = Path(f"/proc/{child.pid}/stat")
        for _ in range(100):  # until it has exited (a zombie: nobody waited for it yet)
            if stat.read_text().rpartition(")")[2].split()[0] == "Z":
                break
            time.sleep(0.05)
        assert not process_alive(child.pid)
    finally:
        child.wait()
    assert process_alive(os.getpid())


async def test_an_unreadable_file_is_skipped_not_fatal(tmp_path: Path) -> None:
    (tmp_path / "garbage.json").write_text("{not json")
    await DirectoryRegistryStore(tmp_path).publish(record("a"), 5.0)
    assert [r.worker_id for r in await reader(tmp_path).workers("demo")] == ["a"]


async def test_readers_racing_heartbeats_always_see_one_whole_record(tmp_path: Path) -> None:
    """A writer rewriting the record as fast as it can, readers reading as fast as they
    can: every read decodes, and finds the worker (never a half-written or absent file)."""
    store = DirectoryRegistryStore(tmp_path)
    store._write(record("w", inflight=0))
    stop = threading.Event()
    problems: list[str] = []
    seen: list[int] = []

    def write() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            # Records of varying length: a torn write would show as a decode error.
            store._write(record("w", inflight=n, idle_since=float(n) if n % 2 else None))

    def read() -> None:
        directory = FileWorkerDirectory(tmp_path, 5.0, clock=lambda: NOW)
        for _ in range(2000):
            try:
                found = directory.records()
            except msgspec.DecodeError as exc:  # pragma: no cover - the failure looked for
                problems.append(str(exc))
                return
            if [r.worker_id for r in found] != ["w"]:
                problems.append(f"saw {found!r}")
                return
            seen.append(found[0].inflight)

    writer = threading.Thread(target=write)
    readers = [threading.Thread(target=read) for _ in range(3)]
    writer.start()
    for thread in readers:
        thread.start()
    for thread in readers:
        thread.join()
    stop.set()
    writer.join()
    assert problems == []
    assert len(set(seen)) > 1  # the readers did see the record change under them
    assert [p.name for p in tmp_path.iterdir()] == ["w.json"]  # no temporary left behind


def test_the_target_picks_the_directory_over_redis(tmp_path: Path) -> None:
    target = RegistryTarget(redis_url="redis://127.0.0.1:1/0", directory=tmp_path)
    assert isinstance(target.open(), DirectoryRegistryStore)
