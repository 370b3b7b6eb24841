"""Where digest mail goes: an SMTP server (`HYDRANT_SMTP_URL`) or `.eml` files in the outbox.

`smtp://user:pass@host:587` sends with STARTTLS (required: credentials never
cross the wire in clear), `smtps://host:465` with implicit TLS; `?tls=none`
allows plain SMTP for a local relay, `?cafile=/path.pem` trusts a private CA.
smtplib runs in a thread so the event loop never waits on a mail server.
Without an SMTP URL (the embedded default) each message is written, whole,
as an `.eml` file into the outbox folder, where a person or a test can read it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import smtplib
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable
from urllib.parse import parse_qs, unquote, urlsplit

from hydrant.errors import ConfigurationError, HydrantError
from hydrant.settings import Settings

TlsMode = Literal["starttls", "implicit", "none"]
SMTP_TIMEOUT_S = 30.0


class MailError(HydrantError):
    """The message was not accepted; sending it again later is safe."""


@runtime_checkable  # injected by name: Litestar checks an injected value against its type
class Mailer(Protocol):
    async def send(self, message: EmailMessage) -> None: ...


@dataclass(frozen=True)
class SmtpMailer:
    host: str
    port: int
    username: str | None = None
    password: str | None = None
    tls: TlsMode = "starttls"
    cafile: str | None = None
    timeout_s: float = SMTP_TIMEOUT_S

    @classmethod
    def from_url(cls, url: str) -> SmtpMailer:
        parts = urlsplit(url)
        if parts.scheme not in {"smtp", "smtps"} or not parts.hostname:
            raise ConfigurationError(
                "HYDRANT_SMTP_URL must look like smtp://user:pass@host:587 (STARTTLS)"
                " or smtps://user:pass@host:465 (implicit TLS)"
            )
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        tls: TlsMode = "implicit" if parts.scheme == "smtps" else "starttls"
        if query.get("tls") == "none" and parts.scheme == "smtp":
            tls = "none"
        elif "tls" in query and query["tls"] not in {"starttls", "none"}:
            raise ConfigurationError("HYDRANT_SMTP_URL: tls must be starttls or none")
        try:
            port = parts.port or (465 if tls == "implicit" else 587)
        except ValueError as exc:
            raise ConfigurationError(f"HYDRANT_SMTP_URL: {exc}") from None
        return cls(
            host=parts.hostname,
            port=port,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
            tls=tls,
            cafile=query.get("cafile"),
        )

    def _context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.cafile)

    def _send_blocking(self, message: EmailMessage) -> None:
        try:
            client: smtplib.SMTP
            if self.tls == "implicit":
                client = smtplib.SMTP_SSL(
                    self.host, self.port, timeout=self.timeout_s, context=self._context()
                )
            else:
                client = smtplib.SMTP(self.host, self.port, timeout=self.timeout_s)
            with contextlib.closing(client):
                client.ehlo()
                if self.tls == "starttls":
                    client.starttls(context=self._context())
                    client.ehlo()
                if self.username is not None:
                    client.login(self.username, self.password or "")
                client.send_message(message)
                # The server's 250 to DATA made the message its own (RFC 5321 §6.1): a
                # session that then breaks at QUIT lost nothing, and calling the send
                # failed would mail the message again at the retry.
                with contextlib.suppress(OSError, smtplib.SMTPException):
                    client.quit()
        except (OSError, smtplib.SMTPException) as exc:
            # The password may be in the server's reply to a failed login: name the kind only.
            raise MailError(
                f"SMTP send to {self.host}:{self.port} failed: {type(exc).__name__}"
            ) from None

    async def send(self, message: EmailMessage) -> None:
        await asyncio.to_thread(self._send_blocking, message)


@dataclass(frozen=True)
class OutboxMailer:
    folder: Path

    def _write(self, message: EmailMessage) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        target = self.folder / f"{stamp}-{secrets.token_hex(4)}.eml"
        partial = target.with_suffix(".eml.part")
        partial.write_bytes(message.as_bytes())
        os.replace(partial, target)  # a reader never sees half a message
        return target

    async def send(self, message: EmailMessage) -> None:
        await asyncio.to_thread(self._write, message)


def make_mailer(settings: Settings) -> Mailer:
    if settings.smtp_url:
        return SmtpMailer.from_url(settings.smtp_url)
    return OutboxMailer(settings.effective_outbox_dir)
