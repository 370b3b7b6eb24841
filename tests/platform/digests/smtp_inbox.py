"""A real SMTP server for tests: aiosmtpd on a free 127.0.0.1 port, STARTTLS and AUTH required.

The certificate comes from a throwaway CA made in the test (trustme); the
client trusts it through `?cafile=` in `HYDRANT_SMTP_URL`, the same way a
deployment would trust a private CA. Received messages are parsed and kept.
"""

from __future__ import annotations

import email
import email.policy
import socket
import ssl
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import trustme
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

USER = "digest-bot"
PASSWORD = "s3cret pass/word"  # a space and a slash: the URL must quote them


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Inbox:
    """What the server accepted; `refuse_next` makes the next N DATA commands fail (451)."""

    messages: list[tuple[list[str], EmailMessage]] = field(default_factory=list)
    refuse_next: int = 0
    logins: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        with self.lock:
            if self.refuse_next > 0:
                self.refuse_next -= 1
                return "451 4.3.0 try again later"
            message = email.message_from_bytes(envelope.content, policy=email.policy.default)
            assert isinstance(message, EmailMessage)
            self.messages.append((list(envelope.rcpt_tos), message))
        return "250 OK"

    def to(self, address: str) -> list[EmailMessage]:
        with self.lock:
            return [m for rcpt, m in self.messages if address in rcpt]

    def count(self) -> int:
        with self.lock:
            return len(self.messages)

    def wait_for(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.count() < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.count()} messages arrived, expected {count}")
            time.sleep(0.05)


class _Controller(Controller):
    def factory(self) -> Any:
        # aiosmtpd warns (per connection, in its thread) when AUTH does not require
        # STARTTLS; under implicit TLS the whole session is encrypted, so that is moot.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Requiring AUTH while not requiring TLS")
            return super().factory()


@dataclass
class SmtpServer:
    inbox: Inbox
    port: int
    cafile: Path

    implicit_tls: bool = False

    def url(self, password: str = PASSWORD) -> str:
        quoted = password.replace("%", "%25").replace(" ", "%20").replace("/", "%2F")
        scheme = "smtps" if self.implicit_tls else "smtp"
        return f"{scheme}://{USER}:{quoted}@127.0.0.1:{self.port}?cafile={self.cafile}"


@contextmanager
def smtp_server(tmp_path: Path, *, implicit_tls: bool = False) -> Iterator[SmtpServer]:
    """STARTTLS on a plain port, or (`implicit_tls`) TLS from the first byte, as `smtps://`."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_context)
    cafile = tmp_path / "smtp-ca.pem"
    ca.cert_pem.write_to_path(str(cafile))
    inbox = Inbox()

    def authenticate(
        server: Any, session: Any, envelope: Any, mechanism: str, data: Any
    ) -> AuthResult:
        if not isinstance(data, LoginPassword):
            return AuthResult(success=False, handled=False)
        ok = data.login == USER.encode() and data.password == PASSWORD.encode()
        if ok:
            inbox.logins.append(data.login.decode())
        return AuthResult(success=ok, handled=False)

    port = free_port()
    tls: dict[str, Any] = (
        {"ssl_context": server_context}
        if implicit_tls
        else {"tls_context": server_context, "require_starttls": True}
    )
    controller = _Controller(
        inbox,
        hostname="127.0.0.1",
        port=port,
        authenticator=authenticate,
        auth_required=True,
        # aiosmtpd counts only STARTTLS as TLS; with implicit TLS the whole session is.
        auth_require_tls=not implicit_tls,
        ready_timeout=10.0,
        **tls,
    )
    controller.start()
    try:
        yield SmtpServer(inbox=inbox, port=port, cafile=cafile, implicit_tls=implicit_tls)
    finally:
        controller.stop()
