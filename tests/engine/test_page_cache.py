"""Priming and evicting a checkpoint's pages, checked with mincore."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hydrant.engine.loader import checkpoint_files
from hydrant.engine.page_cache import evict_page_cache, prime_page_cache, resident_fraction

pytestmark = pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="needs posix_fadvise")


def _write(path: Path, size: int) -> Path:
    path.write_bytes(os.urandom(size))
    return path


def test_evict_then_prime_round_trip(tmp_path: Path) -> None:
    files = [
        _write(tmp_path / "a.safetensors", 3 << 20),
        _write(tmp_path / "b.safetensors", 1 << 20),
    ]
    method = evict_page_cache(files)
    if method == "none":
        pytest.skip("this kernel ignores DONTNEED and drop_caches is not writable")
    assert all(resident_fraction(f) < 0.05 for f in files)

    seen: list[tuple[int, int]] = []
    read = prime_page_cache(
        files, progress=lambda done, total: seen.append((done, total)), chunk_bytes=1 << 20
    )
    assert read == (4 << 20)
    assert seen[-1] == (4 << 20, 4 << 20)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)  # monotonic progress
    assert all(resident_fraction(f) == 1.0 for f in files)

    assert evict_page_cache(files) in ("fadvise", "drop_caches")
    assert all(resident_fraction(f) < 0.05 for f in files)


def test_resident_fraction_of_a_partly_read_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "part.bin", 32 << 20)
    if evict_page_cache([path]) == "none":
        pytest.skip("page eviction is not possible here")
    with path.open("rb") as handle:
        handle.read(1 << 20)
    # readahead may pull in more than was read (up to read_ahead_kb), not the whole 32 MiB
    fraction = resident_fraction(path)
    assert 1 / 32 <= fraction < 1.0


def test_prime_the_files_of_a_checkpoint(demo_model_dir: Path) -> None:
    files = checkpoint_files(demo_model_dir)
    assert prime_page_cache(files) == sum(f.stat().st_size for f in files)
    assert all(resident_fraction(f) == 1.0 for f in files)


def test_empty_file_counts_as_resident(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert resident_fraction(empty) == 1.0
    assert prime_page_cache([empty]) == 0
