"""uvicorn's HTTP/1.1 protocol with a deadline on request headers (slowloris).

Why: uvicorn closes a keep-alive connection that stays silent, but any byte
cancels that timer, so a client that opens connections and sends a header
line now and then holds each one for ever, and a few hundred of them hold the
server. Here every connection must deliver a complete request head within
`timeout_s` of opening (or of its previous response completing), however it
dribbles it in; otherwise the connection is closed (no request has begun, so
there is nobody to answer). The body has its own deadline in the app
(`hardening.py`), which also works under other servers.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from hydrant.settings import Settings


def server_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's options for the gateway (`uvicorn.run(app, host=…, port=…, **options)`).

    One place, so `hydrant serve` and the overhead benchmark run the same server.
    """
    return {
        "log_config": None,
        "access_log": False,
        # Slow clients: idle keep-alive connections close; headers are bounded while they
        # arrive (a trickled body is bounded by the app: hydrant.platform.http.hardening).
        "timeout_keep_alive": settings.keep_alive_timeout_s,
        "h11_max_incomplete_event_size": settings.max_header_bytes,
        "http": header_deadline_protocol(settings.header_read_timeout_s),  # slowloris
        "server_header": False,
    }


def header_deadline_protocol(timeout_s: float) -> type[H11Protocol]:
    """An `H11Protocol` subclass closing connections whose request head is late."""
    if not timeout_s > 0:
        raise ValueError("the header timeout must be a positive number of seconds")

    class HeaderDeadlineH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm_header_deadline()

        def handle_events(self) -> None:
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:  # a request head arrived and its cycle began
                self._disarm_header_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_header_deadline()  # the next request on this connection

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_deadline()
            super().connection_lost(exc)

        def _arm_header_deadline(self) -> None:
            self._disarm_header_deadline()
            self._header_timer = self.loop.call_later(timeout_s, self._header_deadline_passed)

        def _disarm_header_deadline(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_deadline_passed(self) -> None:
            self._header_timer = None
            waiting_for_head = self.conn.their_state is h11.IDLE and (
                self.cycle is None or self.cycle.response_complete
            )
            if waiting_for_head and not self.transport.is_closing():
                self.transport.close()

    return HeaderDeadlineH11Protocol
