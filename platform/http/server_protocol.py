"""uvicorn's HTTP/1.1 protocols with a deadline and a size bound on request heads.

Why the deadline (slowloris): uvicorn closes a keep-alive connection that stays
silent, but any byte cancels that timer, so a client that opens connections and
sends a header line now and then holds each one for ever, and a few hundred of
them hold the server. Here every connection must deliver a complete request
head within `timeout_s` of opening (or of its previous response completing),
however it dribbles it in; otherwise the connection is closed (no request has
begun, so there is nobody to answer). The body has its own deadline in the app
(`hardening.py`), which also works under other servers.

Why two protocols: uvicorn's httptools protocol (llhttp, in C) costs a fraction
of the h11 one's CPU per request, so it is used wherever `httptools` imports.
h11 bounds a growing head itself (`h11_max_incomplete_event_size`); httptools
does not bound it at all, so its subclass counts the bytes of each head as they
arrive and answers 431 to one that grows past `max_head_bytes`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from hydrant.settings import Settings

HEAD_END = b"\r\n\r\n"  # llhttp is strict: a head ends at its first blank CRLF line


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
        "h11_max_incomplete_event_size": settings.max_header_bytes,  # the h11 fallback's bound
        "http": server_protocol(settings.header_read_timeout_s, settings.max_header_bytes),
        "server_header": False,
        # `X-Forwarded-For` is read by client_address.py, behind the proxies an operator
        # listed (HYDRANT_TRUSTED_PROXIES), and `X-Forwarded-Proto` by the web pages: uvicorn's
        # own rewriting (on by default, trusting 127.0.0.1) would let any local process pick
        # its source address, and it is one more layer on every request.
        "proxy_headers": False,
        # uvloop (a runtime dependency off Windows): the gateway's per-token work is
        # event-loop work (a frame read, an SSE write per token per stream), and libuv's
        # loop costs less of it than asyncio's. Named, not uvicorn's "auto", so the choice
        # is this function's (asyncio only where uvloop cannot be installed).
        "loop": event_loop_name(),
    }


def event_loop_name() -> str:
    """uvicorn's `loop` option: "uvloop" where it imports, else "asyncio"."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def server_protocol(timeout_s: float, max_head_bytes: int) -> type[asyncio.Protocol]:
    """The httptools protocol where `httptools` imports (cheaper), else the h11 one."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        return header_deadline_protocol(timeout_s)
    return httptools_header_protocol(timeout_s, max_head_bytes)


class _HeadDeadline:
    """The deadline timer both protocols share; each says when it is waiting for a head."""

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    _header_timeout_s: float
    _header_timer: asyncio.TimerHandle | None = None

    def _waiting_for_head(self) -> bool:
        raise NotImplementedError

    def _arm_header_deadline(self) -> None:
        self._disarm_header_deadline()
        self._header_timer = self.loop.call_later(
            self._header_timeout_s, self._header_deadline_passed
        )

    def _disarm_header_deadline(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_deadline_passed(self) -> None:
        self._header_timer = None
        if self._waiting_for_head() and not self.transport.is_closing():
            self.transport.close()


def _check_timeout(timeout_s: float) -> None:
    if not timeout_s > 0:
        raise ValueError("the header timeout must be a positive number of seconds")


def header_deadline_protocol(timeout_s: float) -> type[H11Protocol]:
    """An `H11Protocol` subclass closing connections whose request head is late."""
    _check_timeout(timeout_s)

    class HeaderDeadlineH11Protocol(_HeadDeadline, H11Protocol):
        _header_timeout_s = timeout_s

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

        def _waiting_for_head(self) -> bool:
            return self.conn.their_state is h11.IDLE and (
                self.cycle is None or self.cycle.response_complete
            )

    return HeaderDeadlineH11Protocol


def httptools_header_protocol(timeout_s: float, max_head_bytes: int) -> type[asyncio.Protocol]:
    """An `HttpToolsProtocol` subclass with the h11 one's deadline and a bound on heads.

    The bound is exact: reads are cut where a head ends (its first blank line)
    and where a Content-Length body ends, so the bytes of one request's body are
    never counted as the next one's head, however requests and reads line up.
    A chunked body's end is found by llhttp; the open head after it is what
    follows the last blank line of that read (exact, the chunked terminator ends
    in one). Only a complete head pipelined behind a chunked body in the same
    read goes unmeasured; a read is at most 256 KiB.
    """
    _check_timeout(timeout_s)
    if max_head_bytes < 1:
        raise ValueError("the request head bound must be a positive number of bytes")
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class HeaderDeadlineHttpToolsProtocol(_HeadDeadline, HttpToolsProtocol):
        _header_timeout_s = timeout_s
        _head_open = True  # the parser is between requests or inside a head
        _head_bytes = 0  # bytes of the open head so far
        _head_tail = b""  # its last 3 bytes: a blank line may straddle two reads
        _head_restarted = False  # a request ended during the last feed
        _body_left: int | None = None  # bytes of a Content-Length body still to come
        _head_refused = False

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm_header_deadline()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_deadline()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            while data and not self._head_refused:
                if self._head_open:
                    size = self._to_head_end(data)
                    if self._head_bytes + size > max_head_bytes:
                        self._refuse_head()
                        return
                elif self._body_left is not None:
                    size = min(self._body_left, len(data))
                else:  # a chunked body: llhttp finds its end
                    size = len(data)
                cut = self._head_open or self._body_left is not None
                piece, data = (data, b"") if size == len(data) else (data[:size], data[size:])
                self._head_restarted = False
                super().data_received(piece)
                parser = self.parser
                if parser is None or self.transport.is_closing() or parser.should_upgrade():
                    return  # refused, lost, or handed over (uvicorn drops the rest too)
                if self._head_open:
                    self._count_head(piece, cut)
                    if self._head_bytes > max_head_bytes:
                        self._refuse_head()

        def _to_head_end(self, data: bytes) -> int:
            """Bytes of `data` up to the end of the open head (all of it if it goes on)."""
            found = (self._head_tail + data).find(HEAD_END)
            return len(data) if found < 0 else found + len(HEAD_END) - len(self._head_tail)

        def _count_head(self, piece: bytes, cut: bool) -> None:
            if not self._head_restarted:  # the same head went on
                self._head_bytes += len(piece)
            elif cut:  # the piece ended where the request did
                self._head_bytes = 0
            else:  # after a chunked body: the head began after the last blank line
                end = piece.rfind(HEAD_END)
                self._head_bytes = len(piece) - (end + len(HEAD_END) if end >= 0 else 0)
            tail = (self._head_tail + piece)[-3:]
            self._head_tail = tail[len(tail) - min(3, self._head_bytes) :]

        def on_headers_complete(self) -> None:
            self._head_open = False
            self._body_left = self._content_length()
            self._disarm_header_deadline()
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if self._body_left is not None:
                self._body_left -= len(body)
            super().on_body(body)

        def on_message_complete(self) -> None:
            self._head_open, self._head_restarted = True, True
            self._head_bytes, self._head_tail, self._body_left = 0, b"", None
            super().on_message_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.transport.is_closing():
                return
            if self._head_refused:
                if self._no_request_running():
                    self._send_431()
                return
            self._arm_header_deadline()  # the next request on this connection

        def _content_length(self) -> int | None:
            length = None
            for name, value in self.headers:
                if name == b"transfer-encoding":
                    return None
                if name == b"content-length":
                    length = int(value)  # llhttp has checked it is digits
            return length

        def _no_request_running(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _waiting_for_head(self) -> bool:
            return self._head_open and self._no_request_running()

        def _refuse_head(self) -> None:
            """431 and close; after the responses still owed, if requests are in flight."""
            self._head_refused = True
            self.logger.warning("Request head larger than %d bytes refused.", max_head_bytes)
            if self._no_request_running():
                self._send_431()
            else:
                self.flow.pause_reading()  # the rest is dropped; on_response_complete answers

        def _send_431(self) -> None:
            body = b"Request Header Fields Too Large"
            head = [b"HTTP/1.1 431 Request Header Fields Too Large\r\n"]
            head += [
                name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers
            ]
            head += [
                b"content-type: text/plain; charset=utf-8\r\n",
                b"content-length: %d\r\n" % len(body),
                b"connection: close\r\n\r\n",
            ]
            self.transport.write(b"".join(head) + body)
            self.transport.close()

    return HeaderDeadlineHttpToolsProtocol
