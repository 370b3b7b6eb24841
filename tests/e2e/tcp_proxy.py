"""A loopback TCP proxy a test can cut: a database outage without stopping the database.

Why a proxy: the PostgreSQL server on a test machine is shared by every test
running on it, so an outage is simulated between one gateway and the server.
`pause()` cuts every open connection (with a reset, as a crashed server or a
broken network does) and refuses new ones until `resume()`; refused
connections are accepted and reset at once, so a client sees the failure
immediately instead of waiting for a connect timeout. `stall()` is the other
kind of outage, a network partition: nothing is refused or reset, bytes just
stop flowing (both ways, on open and new connections) until `resume()`, when
everything held is delivered, as TCP does when a partition heals. A client
without its own timeouts hangs through a stall; that is what it exposes.
`latency_s` delays every byte by that much in each direction (a delay line,
not a per-read sleep: bytes keep streaming, each just arrives later), as a
link to another host or zone does.

Threads, not asyncio: the proxy must keep pumping while the test's own event
loop is busy (or blocked in a synchronous client), and its sockets must never
share a loop with the code under test.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import struct
import threading
import time
from types import TracebackType

_BUFFER = 64 * 1024
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST


def _reset(sock: socket.socket) -> None:
    """Close with a reset so the peer fails now, not at its next read.

    `shutdown(SHUT_RD)` first: closing a socket does not wake a thread blocked in
    `recv` on it, shutting down its read side does (and sends nothing).
    """
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        sock.close()


class TcpProxy:
    """Forwards `127.0.0.1:<port>` to `upstream`; `pause()`/`resume()` make and end an outage."""

    def __init__(self, upstream_host: str, upstream_port: int, latency_s: float = 0.0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.latency_s = latency_s  # one way; read when a connection opens
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._paused = False
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self.accepted = 0  # connections forwarded
        self.refused = 0  # connections reset while paused
        self._acceptor = threading.Thread(target=self._accept_loop, name="tcp-proxy", daemon=True)
        self._acceptor.start()

    @property
    def paused(self) -> bool:
        """Refusing and cutting connections (`pause()`)."""
        return self._paused

    @property
    def down(self) -> bool:
        """In either kind of outage."""
        return self._paused or self.stalled

    def pause(self) -> None:
        """Start the outage: reset every open connection and every new one."""
        with self._lock:
            self._paused = True
            victims, self._open = self._open, set()
        for sock in victims:
            _reset(sock)

    @property
    def stalled(self) -> bool:
        return not self._flowing.is_set()

    def stall(self) -> None:
        """Start a partition: hold every byte, on open and new connections, until `resume()`."""
        self._flowing.clear()

    def resume(self) -> None:
        """End the outage: new connections are forwarded again, held bytes are delivered."""
        with self._lock:
            self._paused = False
        self._flowing.set()

    def open_connections(self) -> int:
        with self._lock:
            return len(self._open) // 2

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                paused = self._paused
            if paused:
                self.refused += 1
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                _reset(client)
                continue
            upstream.settimeout(None)
            client.settimeout(None)
            with self._lock:
                if self._paused:  # paused while we were connecting
                    self.refused += 1
                    _reset(client)
                    _reset(upstream)
                    continue
                self._open.update((client, upstream))
                self.accepted += 1
            pump = self._pump_delayed if self.latency_s > 0 else self._pump
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(
                    target=pump, args=(source, sink), name="tcp-proxy-pump", daemon=True
                ).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(_BUFFER)
                if not data:
                    break
                while not self._flowing.wait(0.2):  # stalled: hold the bytes
                    if self._closed.is_set():
                        return
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                known = source in self._open or sink in self._open
                self._open.discard(source)
                self._open.discard(sink)
            if known:  # a normal close on one side: close the other side too
                for sock in (source, sink):
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                    with contextlib.suppress(OSError):
                        sock.close()

    def _pump_delayed(self, source: socket.socket, sink: socket.socket) -> None:
        """`_pump` through a delay line: a reader stamps each piece, a writer sends it when due."""
        line: queue.Queue[tuple[float, bytes] | None] = queue.Queue()
        delay = self.latency_s

        def write() -> None:
            try:
                while (item := line.get()) is not None:
                    due, data = item
                    pause = due - time.monotonic()
                    if pause > 0:
                        time.sleep(pause)
                    while not self._flowing.wait(0.2):
                        if self._closed.is_set():
                            return
                    sink.sendall(data)
            except OSError:
                pass
            finally:
                self._forget(source, sink)

        writer = threading.Thread(target=write, name="tcp-proxy-delay", daemon=True)
        writer.start()
        try:
            while data := source.recv(_BUFFER):
                line.put((time.monotonic() + delay, data))
        except OSError:
            pass
        finally:
            line.put(None)  # the writer delivers what it holds, then closes both sides

    def _forget(self, source: socket.socket, sink: socket.socket) -> None:
        with self._lock:
            known = source in self._open or sink in self._open
            self._open.discard(source)
            self._open.discard(sink)
        if known:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()
        self.pause()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._acceptor.join(timeout=2)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
