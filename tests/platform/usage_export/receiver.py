"""A real HTTP receiver for the usage export tests that behaves like Stripe's meter events.

It runs `http.server` on a thread (a real socket, a real HTTP exchange), takes Stripe's
form-encoded events and the generic JSON batches, checks the bearer secret, and honours
the idempotency key as Stripe does: a key seen before is answered 200 again and not
counted again. `script` makes the next requests fail (`500`), or accept and then answer
too late for the client (`hang`: the receiver has the records, the exporter never hears),
or accept and then go down without answering (`crash`; `running` again on the same port
is its restart, with what it had accepted kept).
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl

SECRET = "sk_test_export_secret"


class Receiver:
    def __init__(self, *, delay_s: float = 0.0) -> None:
        self.accepted: dict[str, dict[str, Any]] = {}  # identifier -> the event first accepted
        self.posts: Counter[str] = Counter()  # identifier -> times it was sent to us
        self.requests = 0
        self.script: list[str] = []
        self.delay_s = delay_s
        self.hang_s = 5.0
        self.release = threading.Event()  # ends every hang at teardown
        self.got_one = threading.Event()
        self.down = threading.Event()  # set once a `crash` has closed the port
        self.lock = threading.Lock()
        self.url = ""
        self.port = 0

    def handle(self, handler: BaseHTTPRequestHandler) -> tuple[int, bytes]:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length).decode()
        if handler.headers.get("Authorization") != f"Bearer {SECRET}":
            return 401, b'{"error": {"message": "bad key"}}'
        if handler.headers.get("Content-Type", "").startswith("application/json"):
            events = json.loads(body)["records"]
        else:
            events = [dict(parse_qsl(body))]
        with self.lock:
            self.requests += 1
            action = self.script.pop(0) if self.script else "ok"
        if action == "500":
            return 500, b'{"error": {"message": "try later"}}'
        if self.delay_s:
            self.release.wait(self.delay_s)
        with self.lock:
            for event in events:
                key = event["identifier"]
                self.posts[key] += 1
                self.accepted.setdefault(key, event)  # seen before: replayed, not counted
        self.got_one.set()
        if action == "hang":
            self.release.wait(self.hang_s)
        if action == "crash":
            return 0, b""
        return 200, b'{"object": "billing.meter_event"}'


def _go_down(receiver: Receiver, server: Any) -> None:
    server.shutdown()
    server.server_close()  # the port refuses connections, as after a crash
    receiver.down.set()


@contextmanager
def running(receiver: Receiver, port: int = 0) -> Iterator[Receiver]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            status, payload = receiver.handle(self)
            if status == 0:  # `crash`: it has the records, then dies before answering
                self.close_connection = True
                threading.Thread(target=_go_down, args=(receiver, self.server), daemon=True).start()
                return
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except OSError:  # the client gave up (timed out or was killed)
                pass

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    receiver.down.clear()
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    receiver.port = server.server_address[1]
    receiver.url = f"http://127.0.0.1:{receiver.port}/v1/billing/meter_events"
    try:
        yield receiver
    finally:
        receiver.release.set()
        server.shutdown()  # returns at once when a `crash` has shut it down already
        server.server_close()
