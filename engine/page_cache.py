"""Keep a checkpoint's pages warm in the OS page cache, or evict them on purpose.

A worker that scaled to zero and unloaded its model starts again from the
files; if their pages are still cached, that load runs at memory speed rather
than disk speed. `prime_page_cache` reads the files once, sequentially (the
pattern disks and readahead like best), so a later load hits the cache.
`evict_page_cache` is the inverse, for honest cold-start measurements: it
asks the kernel to drop the files' clean pages (`POSIX_FADV_DONTNEED`, no root
needed), falling back to `/proc/sys/vm/drop_caches` only where that is
writable. `resident_fraction` (mincore) tells whether either worked, since a
kernel is free to ignore both advices.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import mmap
import os
from collections.abc import Callable, Iterable
from pathlib import Path

logger = logging.getLogger(__name__)

CHUNK_BYTES = 16 << 20

Progress = Callable[[int, int], None]  # (bytes done, bytes total)


def _total_bytes(files: list[Path]) -> int:
    return sum(f.stat().st_size for f in files)


def prime_page_cache(
    files: Iterable[Path], progress: Progress | None = None, chunk_bytes: int = CHUNK_BYTES
) -> int:
    """Read every file start to end (after a WILLNEED hint); returns the bytes read."""
    paths = [Path(f) for f in files]
    total = _total_bytes(paths)
    done = 0
    buffer = bytearray(chunk_bytes)
    view = memoryview(buffer)
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            while True:
                n = os.readv(fd, [view])
                if n <= 0:
                    break
                done += n
                if progress is not None:
                    progress(done, total)
        finally:
            os.close(fd)
    return done


def advise_willneed(path: Path) -> None:
    """Ask the kernel to start reading the whole file in the background, now.

    The loader calls it before touching a shard through its memory map: page
    faults alone read in readahead-window steps, while WILLNEED queues the
    whole file at once, so a cold load runs close to the disk's sequential speed.
    """
    if not hasattr(os, "posix_fadvise"):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    finally:
        os.close(fd)


def evict_page_cache(files: Iterable[Path]) -> str:
    """Drop the files' cached pages; returns the method that was used.

    DONTNEED only drops clean pages that no process maps, so callers should
    release their own mappings (loaded models) first.
    """
    paths = [Path(f) for f in files]
    if hasattr(os, "posix_fadvise"):
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            try:
                if _writable(path):
                    os.fdatasync(fd)  # dirty pages cannot be dropped; write them first
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        if all(resident_fraction(p) < 0.05 for p in paths):
            return "fadvise"
    try:
        with open("/proc/sys/vm/drop_caches", "w") as handle:
            handle.write("3\n")
        return "drop_caches"
    except OSError:
        logger.warning("could not evict page cache pages (fadvise ignored, drop_caches denied)")
        return "none"


def _writable(path: Path) -> bool:
    return os.access(path, os.W_OK)


_libc: ctypes.CDLL | None = None


def _load_libc() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        if name is None:
            raise OSError("the C library was not found; mincore is unavailable")
        libc = ctypes.CDLL(name, use_errno=True)
        libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        libc.mmap.restype = ctypes.c_void_p
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.munmap.restype = ctypes.c_int
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        libc.mincore.restype = ctypes.c_int
        _libc = libc
    return _libc


_MAP_FAILED = ctypes.c_void_p(-1).value


def resident_fraction(path: Path) -> float:
    """Share of the file's pages in the page cache now (mincore over a read-only map).

    Mapping the file does not fault any page in; mincore only reports.
    """
    size = Path(path).stat().st_size
    if size == 0:
        return 1.0
    libc = _load_libc()
    pages = -(-size // mmap.PAGESIZE)
    vec = (ctypes.c_ubyte * pages)()
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address is None or address == _MAP_FAILED:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        try:
            if libc.mincore(address, size, vec) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err))
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)
    return sum(v & 1 for v in vec) / pages
