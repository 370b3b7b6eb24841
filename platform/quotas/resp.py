"""Redis's wire (RESP) as both quota-script clients speak it: where to connect, what a new
connection sends first, a command's bytes and an error reply's exception."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import unquote, urlsplit

import hiredis
from redis import exceptions as redis_errors


@dataclass(frozen=True)
class RedisAddress:
    """Where and how to connect, from a `redis://` or `rediss://` URL."""

    host: str
    port: int
    db: int
    username: str | None
    password: str | None
    tls: bool

    @staticmethod
    def speaks(url: str) -> bool:
        """Whether this client can connect there: TCP (`redis://`, `rediss://`), not `unix://`."""
        return urlsplit(url).scheme in ("redis", "rediss")

    @classmethod
    def from_url(cls, url: str) -> RedisAddress:
        parts = urlsplit(url)
        if not cls.speaks(url):
            raise ValueError(f"unsupported Redis URL scheme {parts.scheme!r} (redis, rediss)")
        path = parts.path.strip("/")
        return cls(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 6379,
            db=int(path) if path else 0,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
            tls=parts.scheme == "rediss",
        )

    def setup_commands(self) -> list[tuple[str | int, ...]]:
        """What a new connection sends first: AUTH (with a password), SELECT (a db but 0)."""
        commands: list[tuple[str | int, ...]] = []
        if self.password is not None:
            user = (self.username,) if self.username else ()
            commands.append(("AUTH", *user, self.password))
        if self.db:
            commands.append(("SELECT", self.db))
        return commands


def pack_command(command: Sequence[Any]) -> bytes:
    """RESP bytes of one command (hiredis's C packer; its stub types only 1-tuples)."""
    return hiredis.pack_command(cast(Any, tuple(command)))


def reply_error(message: str) -> redis_errors.RedisError:
    """A Redis error reply as the redis-py exception it would have raised."""
    if message.startswith("NOSCRIPT"):
        return redis_errors.NoScriptError(message)
    if message.startswith("READONLY"):
        return redis_errors.ReadOnlyError(message)
    if message.startswith(("NOAUTH", "WRONGPASS")):
        return redis_errors.AuthenticationError(message)
    return redis_errors.ResponseError(message)
