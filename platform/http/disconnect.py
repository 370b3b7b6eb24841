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
    `ClientDisconnected`. Call it only after the request body was read.

    `work` runs in the caller's task (a listener task cancels it, as `asyncio.timeout`
    does): a task of its own would cost a task and a loop pass before it starts and
    another after it ends, on the path to a first token."""
    task = asyncio.current_task()
    assert task is not None, "unless_client_leaves runs inside a task"
    left = False
    watching = True  # False once `work` is over: a callback already queued then is late

    def stop(listener: asyncio.Future[None]) -> None:
        nonlocal left
        if watching and not listener.cancelled() and listener.exception() is None:
            left = True  # the client left while `work` ran
            task.cancel()

    listener = asyncio.ensure_future(_until_disconnect(receive))
    listener.add_done_callback(stop)
    try:
        result = await work
    except asyncio.CancelledError:
        if left and task.uncancel() == 0:  # cancelled for the disconnect alone
            raise ClientDisconnected(
                "the client closed the connection; the request was stopped"
            ) from None
        raise  # (also) cancelled from outside: the handler itself is being stopped
    finally:
        watching = False
        listener.remove_done_callback(stop)
        listener.cancel()
    if left:  # `work` ended its own way although it was cancelled: its answer stands
        task.uncancel()
    return result
