"""Stop a handler's work when its client disconnects.

Why: uvicorn never cancels an ASGI handler whose client has gone; only a
streamed response (Litestar's `Stream`) listens for `http.disconnect`. So a
non-streamed completion, or any request still queued for admission or
waiting for its first token, would otherwise run to its end on the engine or
the upstream server, holding its capacity and billed in full, for nobody.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from litestar.types import Receive

from hydrant.platform.errors import ClientDisconnected

T = TypeVar("T")


async def _until_disconnect(receive: Receive) -> None:
    """Returns when the server reports the client gone (after the body, `receive` only
    waits for that; anything else is skipped)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_client_leaves(receive: Receive, work: Coroutine[Any, Any, T]) -> T:
    """`work`'s result; if the client disconnects first, `work` is cancelled and, once its
    own cleanup ran (the engine request aborted, the one ledger entry written), this raises
    `ClientDisconnected`. Call it only after the request body was read."""
    job = asyncio.ensure_future(work)
    listener = asyncio.ensure_future(_until_disconnect(receive))
    try:
        await asyncio.wait((job, listener), return_when=asyncio.FIRST_COMPLETED)
    finally:
        listener.cancel()
        if not job.done():  # the client left (or this handler itself is being cancelled)
            job.cancel()
            await asyncio.wait((job,))  # its cleanup runs to its end before the answer
    if job.cancelled():
        raise ClientDisconnected("the client closed the connection; the request was stopped")
    return job.result()
