"""The startup heap of a long-running server process, kept out of the garbage collector's scans.

Python's cyclic collector walks every tracked object of the generation it
collects, and a full (oldest-generation) collection walks them all: in a
worker, the imports, torch, the model's modules and the tokenizer (about
340,000 objects with the demo model); in the gateway, Litestar, SQLAlchemy,
httpx and their caches. Measured with `gc.callbacks` during
`bench/serving.py` on the 2-core host, one such collection took 100-380 ms,
and it holds the GIL the whole time: every stream of that process stalls at
once (the worker's engine step as well), which is what a streamed response's
ITL p99 then reports. These objects live as long as the process, so scanning
them finds nothing; `gc.freeze()` moves them to a permanent generation the
collector skips, and later collections walk only what requests allocated
(vLLM freezes its startup heap for the same reason). Objects still die by
reference counting as usual; only cycles among frozen objects outlive their
last reference, so a process that frees a big part of its startup heap (a
worker unloading its model) thaws first (`thaw_heap`).
"""

from __future__ import annotations

import gc


def freeze_heap() -> int:
    """Collect what is garbage now, then exempt every surviving object from later scans.

    Call once the process has built what it keeps (a worker: its loaded
    engine; the gateway: its app), never in a test process. Returns how
    many objects were frozen (for the log line)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def thaw_heap() -> None:
    """Give the frozen objects back to the collector (before freeing many of them)."""
    gc.unfreeze()
