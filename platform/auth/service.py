"""Authentication: a bearer key in, a `Principal` out, or a refusal.

The flow: parse (a typo or truncated key fails its checksum without touching
the database) → HMAC the key → the short-lived cache → on a miss, look the key
up by its public prefix and verify the stored HMAC in constant time (an
unknown prefix does the same work against a dummy) → key usable now (not
revoked, not expired, within rotation grace) → tenant active → scope.

Every failure of the key itself answers the same 401 body, so nothing tells an
unknown key from a revoked one. Past that, the key is proven valid, so a
suspended tenant (403, said plainly) or a missing scope (403) reveal nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime

from hydrant.platform.auth.last_used import LastUsedRecorder
from hydrant.platform.auth.principal import Principal
from hydrant.platform.auth.repository import KeyRecord, find_key_record
from hydrant.platform.db.base import utcnow
from hydrant.platform.db.session import Database
from hydrant.platform.errors import AuthenticationFailed, PermissionDenied
from hydrant.platform.keys.cache import KeyCache
from hydrant.platform.keys.codec import MalformedKeyError, ParsedKey, parse_key
from hydrant.platform.keys.hashing import hash_key, verify_against_dummy, verify_key
from hydrant.platform.keys.service import KeyService

log = logging.getLogger(__name__)

INVALID_KEY = "invalid API key"
MISSING_KEY = "missing API key: send it as `Authorization: Bearer <key>`"


def invalid_key() -> AuthenticationFailed:
    return AuthenticationFailed(INVALID_KEY)


def bearer_token(header: str | None) -> str:
    """The token of an `Authorization: Bearer …` header; 401 when there is none."""
    if header is None:
        raise AuthenticationFailed(MISSING_KEY)
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationFailed(MISSING_KEY)
    return token.strip()


class Authenticator:
    """One per process: holds the server secret, the key cache and the last-used recorder."""

    def __init__(
        self,
        database: Database,
        server_secret: Callable[[], bytes],
        *,
        cache_ttl_s: float = 5.0,
        clock: Callable[[], datetime] = utcnow,
        monotonic: Callable[[], float] = time.monotonic,
        bootstrap_key: ParsedKey | None = None,
        last_used: LastUsedRecorder | None = None,
    ) -> None:
        self._database = database
        self._secret_source = server_secret
        self._secret: bytes | None = None
        self.cache: KeyCache[KeyRecord] = KeyCache(cache_ttl_s, clock=monotonic)
        self.clock = clock
        self.last_used = last_used or LastUsedRecorder(database)
        self._bootstrap = bootstrap_key
        self._bootstrap_pending = bootstrap_key is not None

    @property
    def server_secret(self) -> bytes:
        """Resolved on first use, so building an app never touches the data directory."""
        if self._secret is None:
            self._secret = self._secret_source()
        return self._secret

    async def authenticate(self, authorization: str | None, scope: str) -> Principal:
        token = bearer_token(authorization)
        try:
            parsed = parse_key(token)
        except MalformedKeyError:
            raise invalid_key() from None
        record = await self._record(parsed)
        now = self.clock()
        if not record.usable_at(now):
            raise invalid_key()
        if not record.tenant_active:
            raise PermissionDenied(
                "tenant suspended: this key's tenant is suspended; contact your administrator",
                code="tenant_suspended",
            )
        if scope not in record.scopes:
            raise PermissionDenied(
                f"this key does not have the `{scope}` scope", code="insufficient_scope"
            )
        self.last_used.touch(record.key_id, now)
        return _principal(record)

    async def _record(self, parsed: ParsedKey) -> KeyRecord:
        digest = hash_key(parsed.secret, self.server_secret)
        cached = self.cache.get(digest)
        if cached is not None:
            return cached
        bootstrap = self._bootstrap
        if self._bootstrap_pending and bootstrap is not None and parsed.prefix == bootstrap.prefix:
            await self.ensure_bootstrap_key()
        async with self._database.session() as session:
            record = await find_key_record(session, parsed.prefix)
        if record is None:
            verify_against_dummy(parsed.secret, self.server_secret)
            raise invalid_key()
        if not verify_key(parsed.secret, record.key_hash, self.server_secret):
            raise invalid_key()
        if record.usable_at(self.clock()):
            self.cache.put(digest, record)
        return record

    async def ensure_bootstrap_key(self) -> bool:
        """Store the configured bootstrap admin key; False (and retried later) on failure."""
        if self._bootstrap is None:
            return True
        try:
            async with self._database.session() as session:
                service = KeyService(session, server_secret=self.server_secret)
                await service.adopt_admin_key(self._bootstrap.secret)
        except Exception as exc:  # the database may be down or not migrated yet
            log.warning("could not store the bootstrap admin key yet: %s", type(exc).__name__)
            return False
        self._bootstrap_pending = False
        return True


def _principal(record: KeyRecord) -> Principal:
    plan = record.plan
    return Principal(
        tenant_id=record.tenant_id,
        key_id=record.key_id,
        key_prefix=record.prefix,
        scopes=record.scopes,
        plan_id=plan.plan_id if plan is not None else None,
        weight=float(plan.fair_share_weight) if plan is not None else 1.0,
        allowed_models=plan.allowed_models if plan is not None else None,
        plan=plan,
        timezone=record.timezone,
    )
