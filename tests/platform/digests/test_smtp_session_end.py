"""Where an SMTP session breaks decides whether the send failed: before the server's 250
to DATA the message is not delivered (MailError: the alert goes back to pending and is
retried); after it the server owns the message, so a session broken at QUIT is a
delivered mail, not a failure that would mail it again at the retry.

The server is a real one on a socket, speaking just enough SMTP (no TLS: `?tls=none`)
to break at a chosen step, which aiosmtpd cannot be told to do.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from email.message import EmailMessage

import pytest

from hydrant.platform.mail.mailer import MailError, SmtpMailer

REPLIES = {
    b"EHLO": b"250 relay.test\r\n",
    b"HELO": b"250 relay.test\r\n",
    b"MAIL": b"250 OK\r\n",
    b"RCPT": b"250 OK\r\n",
    b"DATA": b"354 go ahead\r\n",
}


@contextmanager
def breaking_server(at: str) -> Iterator[tuple[int, list[bytes]]]:
    """One SMTP session that ends badly: `at="quit"` answers QUIT with a 421,
    `at="data"` resets the connection when the message's end arrives, before any reply."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    received: list[bytes] = []

    def serve() -> None:
        conn, _ = listener.accept()
        with conn, conn.makefile("rb") as lines:
            conn.sendall(b"220 relay.test ESMTP\r\n")
            in_data = False
            body: list[bytes] = []
            for line in lines:
                if in_data:
                    if line != b".\r\n":
                        body.append(line)
                        continue
                    in_data = False
                    if at == "data":
                        # RST, not FIN: the message's end was never answered
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                        return
                    received.append(b"".join(body))
                    conn.sendall(b"250 queued\r\n")
                    continue
                verb = line[:4].upper()
                if verb == b"QUIT":
                    conn.sendall(b"421 shutting down\r\n")
                    return
                in_data = verb == b"DATA"
                conn.sendall(REPLIES.get(verb, b"250 OK\r\n"))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield port, received
    finally:
        thread.join(timeout=10)
        listener.close()


def message() -> EmailMessage:
    mail = EmailMessage()
    mail["From"] = "hydrant@acme.test"
    mail["To"] = "ops@acme.test"
    mail["Subject"] = "budget alert"
    mail.set_content("80% of the day's spend")
    return mail


async def test_a_session_broken_at_quit_after_the_250_is_a_delivered_mail() -> None:
    with breaking_server("quit") as (port, received):
        mailer = SmtpMailer.from_url(f"smtp://127.0.0.1:{port}?tls=none")
        await mailer.send(message())  # no MailError: a retry would mail it twice
    assert len(received) == 1 and b"80% of the day's spend" in received[0]


async def test_a_session_broken_before_the_250_is_a_failed_send() -> None:
    with breaking_server("data") as (port, received):
        mailer = SmtpMailer.from_url(f"smtp://127.0.0.1:{port}?tls=none")
        with pytest.raises(MailError, match=f"127.0.0.1:{port} failed"):
            await mailer.send(message())
    assert received == []
