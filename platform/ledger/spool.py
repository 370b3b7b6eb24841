"""A local, durable spool for ledger entries written while the database is unreachable.

Why: every request must leave exactly one ledger entry. If the database is
down, the gateway either stops serving or writes the entry somewhere that
survives a crash; this file is that somewhere. Each append is fsync'd before it
returns, so an acknowledged entry is on disk. `replay` hands the entries, in
order, to a sink that inserts-if-absent by request id, then compacts the file;
a crash between the two only re-sends entries the sink already has, so nothing
is lost and nothing is counted twice.

A crash mid-append leaves a last line without its newline: it was never
acknowledged, so opening the spool cuts it off (otherwise the next append would
be glued to it and lost too). A complete line with a bad checksum is skipped
by replay and kept, for a person, in `<name>.corrupt`. When the size cap is
reached or the filesystem refuses a write, `append` raises `SpoolFullError`
and leaves the file as it was, so the gateway can refuse new work instead of
serving it unmetered. One process owns a spool at a time (a lock file).

With `HYDRANT_LEDGER_COMMIT=journal` the same file is the ledger's write-ahead
journal: every entry goes here first (`append_many`: one fsync for a group),
and `replay_batches` moves them into the database in batches.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from hydrant.errors import HydrantError
from hydrant.platform.ledger.spool_codec import (
    MAX_RECORD_BYTES,
    CorruptRecordError,
    decode_record,
    encode_record,
)

DEFAULT_MAX_BYTES = 256 * 1024 * 1024
_SCAN_CHUNK = 64 * 1024

Sink = Callable[[dict[str, Any]], Awaitable[object]]
BatchSink = Callable[[list[dict[str, Any]]], Awaitable[object]]


class SpoolError(HydrantError):
    """The spool cannot be used."""


class SpoolLockedError(SpoolError):
    """Another process (or another spool object) holds this spool."""


class SpoolFullError(SpoolError):
    """An entry could not be made durable: the size cap, or the filesystem refused it."""


@dataclass(frozen=True)
class ReplayResult:
    """`replayed` went to the sink; `remaining` are still spooled (the sink failed on the first;
    -1 when not counted)."""

    replayed: int
    remaining: int
    corrupt: int
    error: Exception | None = None


def _write_all(fd: int, data: bytes) -> None:
    """Write every byte (os.write may write fewer); a seam for tests of a refusing disk."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LedgerSpool:
    """The spool file at `path`; appends are blocking (fsync): call them off the event loop."""

    def __init__(self, path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.path = Path(path)
        self.quarantine_path = self.path.with_name(self.path.name + ".corrupt")
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._replaying = False
        self._torn = False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(
            self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT
        )
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(self._lock_fd)
            raise SpoolLockedError(f"spool {self.path} is held by another owner") from exc
        created = not self.path.exists()
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        if created:
            _fsync_dir(self.path.parent)
        self._size = self._cut_torn_tail()

    def _cut_torn_tail(self) -> int:
        """Drop an unterminated last line (an append that never returned); the new size."""
        size = os.fstat(self._fd).st_size
        if size == 0:
            return 0
        keep = size
        while keep > 0:
            start = max(0, keep - _SCAN_CHUNK)
            chunk = os.pread(self._fd, keep - start, start)
            if keep == size and chunk.endswith(b"\n"):
                return size
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            keep = start
        try:
            os.ftruncate(self._fd, keep)
            os.fsync(self._fd)
        except OSError as exc:
            os.close(self._fd)
            os.close(self._lock_fd)
            raise SpoolError(f"spool {self.path} has a torn tail it cannot cut") from exc
        return keep

    @property
    def size_bytes(self) -> int:
        return self._size

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    def append(self, entry: Mapping[str, Any]) -> None:
        """Make `entry` durable before returning, or raise `SpoolFullError` writing nothing."""
        self.append_many([entry])

    def append_many(self, entries: Sequence[Mapping[str, Any]]) -> None:
        """Make every entry durable with one write and one fsync, or none of them.

        Why one fsync for many: as the ledger's journal (`HYDRANT_LEDGER_COMMIT=journal`)
        every response waits for its entry to be on disk, and the entries of requests
        that finish together share the disk's flush instead of queueing for one each.
        """
        line = b"".join(encode_record(entry) for entry in entries)
        if not line:
            return
        with self._lock:
            if self._fd < 0:
                raise SpoolError(f"spool {self.path} is closed")
            size = self._size
            if size + len(line) > self._max_bytes:
                raise SpoolFullError(
                    f"spool {self.path} reached its cap of {self._max_bytes} bytes"
                )
            try:
                if self._torn:
                    self._truncate(size)  # never glue a record to a torn one
                _write_all(self._fd, line)
                os.fsync(self._fd)
            except OSError as exc:
                try:
                    self._truncate(size)
                except OSError:
                    self._torn = True
                raise SpoolFullError(f"spool {self.path} refused a write: {exc.strerror}") from exc
            self._size = size + len(line)

    def _truncate(self, size: int) -> None:
        os.ftruncate(self._fd, size)
        os.fsync(self._fd)
        self._torn = False

    def _iter_lines(self, end: int) -> Iterator[bytes]:
        """Lines of the first `end` bytes; later appends are not read."""
        with open(self.path, "rb") as handle:
            position = 0
            while position < end:
                line = handle.readline(min(end - position, MAX_RECORD_BYTES + 1))
                if not line:
                    return
                position += len(line)
                yield line

    def pending(self) -> int:
        """How many intact records the spool holds now."""
        with self._lock:
            end = self._size
        count = 0
        for line in self._iter_lines(end):
            try:
                decode_record(line)
            except CorruptRecordError:
                continue
            count += 1
        return count

    async def replay(self, sink: Sink) -> ReplayResult:
        """Send spooled entries, oldest first, to `sink`; keep from the first it fails on."""

        async def one_by_one(batch: list[dict[str, Any]]) -> None:
            await sink(batch[0])

        return await self.replay_batches(one_by_one, batch_size=1)

    async def replay_batches(
        self, sink: BatchSink, *, batch_size: int = 256, count_remaining: bool = True
    ) -> ReplayResult:
        """Send spooled entries, oldest first, to `sink` in lists of up to `batch_size`.

        A batch the sink fails on is kept whole, with everything after it (the sink
        inserts-if-absent, so entries of a batch that half-landed count once on the
        next replay). A corrupt line ends the batch before it, so every byte before
        the compaction point was either sent or quarantined. `count_remaining=False`
        skips reading the rest of the file to count it (`remaining` is then -1): the
        journal's mover retries every second, and a full spool is large.
        """
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if self._replaying:
            raise SpoolError("a replay of this spool is already running")
        self._replaying = True
        try:
            with self._lock:
                end = self._size
            offset, replayed = 0, 0
            error: Exception | None = None
            corrupt: list[bytes] = []
            batch: list[dict[str, Any]] = []
            batch_bytes = 0

            async def send() -> bool:
                nonlocal offset, replayed, error, batch, batch_bytes
                try:
                    await sink(batch)
                except Exception as exc:  # the sink's failure is reported, not raised
                    error = exc
                    return False
                replayed += len(batch)
                offset += batch_bytes
                batch, batch_bytes = [], 0
                return True

            for line in self._iter_lines(end):
                try:
                    entry = decode_record(line)
                except CorruptRecordError:
                    if batch and not await send():
                        break
                    corrupt.append(line)
                    offset += len(line)
                    continue
                batch.append(entry)
                batch_bytes += len(line)
                if len(batch) >= batch_size and not await send():
                    break
            else:
                if batch:
                    await send()
            self._compact(offset, corrupt)
            remaining = self.pending() if count_remaining else -1
            return ReplayResult(replayed, remaining, len(corrupt), error)
        finally:
            self._replaying = False

    def _compact(self, done: int, corrupt: list[bytes]) -> None:
        """Drop bytes [0, done): quarantine corrupt lines, keep the rest and later appends."""
        if corrupt:
            with open(self.quarantine_path, "ab") as quarantine:
                quarantine.writelines(corrupt)
                quarantine.flush()
                os.fsync(quarantine.fileno())
        if done == 0:
            return
        with self._lock:
            kept = os.pread(self._fd, self._size - done, done) if self._size > done else b""
            if not kept:
                os.ftruncate(self._fd, 0)
                os.fsync(self._fd)
                self._size = 0
                return
            temporary = self.path.with_name(self.path.name + ".tmp")
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                _write_all(fd, kept)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temporary, self.path)
            _fsync_dir(self.path.parent)
            os.close(self._fd)
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
            self._size = len(kept)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            if self._lock_fd >= 0:
                os.close(self._lock_fd)  # closing the descriptor releases the flock
                self._lock_fd = -1

    def __enter__(self) -> LedgerSpool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
