"""A slowloris client: the raw-socket move that the header deadline must defeat."""

from __future__ import annotations

import socket
import time

import pytest


def dribble(sock: socket.socket, first: bytes, limit_s: float, every_s: float = 0.3) -> float:
    """Send `first`, then a header line every `every_s`; seconds until the server hangs up.

    Fails the test if the server still holds the connection after `limit_s`.
    """
    start = time.monotonic()
    sock.sendall(first)
    sock.settimeout(every_s)
    while time.monotonic() - start < limit_s:
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - start
        except TimeoutError:
            pass
        except ConnectionResetError:
            return time.monotonic() - start
        try:
            sock.sendall(b"X-Slow: 1\r\n")
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic() - start
    pytest.fail(f"a connection dribbling its head was held for {limit_s} s")
