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

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.key_cache import KeyCache
from hydrant.platform.auth.key_codec import MalformedKeyError, ParsedKey, parse_key
from hydrant.platform.auth.key_hashing import hash_key, verify_against_dummy, verify_key
from hydrant.platform.auth.last_used import LastUsedRecorder
from hydrant.platform.auth.principal import Principal
from hydrant.platform.auth.repository import KeyRecord, find_key_record
from hydrant.platform.db.base import utcnow
from hydrant.platform.db.errors import DATABASE_UNAVAILABLE
from hydrant.platform.db.session import Database
from hydrant.platform.errors import AuthenticationFailed, PermissionDenied, ServiceUnavailable

log = logging.getLogger(__name__)

INVALID_KEY = "invalid API key"
# A lookup that takes longer is treated as the database being away (a stalled network).
LOOKUP_TIMEOUT_S = 2.0
# During a database outage, keys verified this recently keep working (revocations made
# meanwhile on other nodes apply when it is back); others get a 503 with Retry-After.
OUTAGE_GRACE_S = 300.0
LAST_GOOD_MAX = 10_000
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


# Stores the bootstrap admin key (session, server secret, key): key management's rule,
# passed in so that checking keys does not depend on managing them.
StoreBootstrapKey = Callable[[AsyncSession, bytes, ParsedKey], Awaitable[object]]


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
        store_bootstrap_key: StoreBootstrapKey | None = None,
        last_used: LastUsedRecorder | None = None,
    ) -> None:
        self._database = database
        self._secret_source = server_secret
        self._secret: bytes | None = None
        self.cache: KeyCache[KeyRecord] = KeyCache(cache_ttl_s, clock=monotonic)
        self.clock = clock
        self.last_used = last_used or LastUsedRecorder(database)
        if bootstrap_key is not None and store_bootstrap_key is None:
            raise ValueError("a bootstrap key needs store_bootstrap_key (keys.service)")
        self._bootstrap = bootstrap_key
        self._store_bootstrap = store_bootstrap_key
        self._bootstrap_pending = bootstrap_key is not None
        self._last_good: dict[str, tuple[float, KeyRecord]] = {}
        self._monotonic = monotonic
        self._outage_logged = False
        self._flusher: asyncio.Task[None] | None = None
        self._lookups: dict[str, asyncio.Future[KeyRecord | None]] = {}
        self._refreshing: set[str] = set()  # digests being looked up again in the background

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
            if self.cache.refresh_due(digest) and digest not in self._refreshing:
                self._refresh(digest, parsed, cached)
            return cached
        bootstrap = self._bootstrap
        if self._bootstrap_pending and bootstrap is not None and parsed.prefix == bootstrap.prefix:
            await self.ensure_bootstrap_key()
        try:
            async with asyncio.timeout(LOOKUP_TIMEOUT_S):
                record = await asyncio.shield(self._lookup(parsed.prefix))
        except DATABASE_UNAVAILABLE as exc:
            return self._during_outage(digest, exc)
        if record is None:
            verify_against_dummy(parsed.secret, self.server_secret)
            raise invalid_key()
        if not verify_key(parsed.secret, record.key_hash, self.server_secret):
            raise invalid_key()
        self._outage_logged = False
        self._keep(digest, record)
        return record

    def _keep(self, digest: str, record: KeyRecord) -> None:
        """Cache a verified key's record while it is usable; else forget the key here."""
        if record.usable_at(self.clock()):
            self.cache.put(digest, record)
            self._remember(digest, record)
        else:
            self.cache.invalidate(digest)
            self._last_good.pop(digest, None)

    def _refresh(self, digest: str, parsed: ParsedKey, cached: KeyRecord) -> None:
        """Look a cached key up again in the background (key_cache.py says why); the
        request that noticed goes on with the entry it found. What the database says then
        replaces the entry, or drops it (a key revoked, expired or deleted meanwhile, on
        any node); a failed lookup leaves it to expire as it would have. An entry gone or
        replaced while the lookup ran (the key revoked on this node, which drops it at
        once) is left as it is: the lookup may have read the row before the revocation."""
        self._refreshing.add(digest)

        def done(lookup: asyncio.Future[KeyRecord | None]) -> None:
            self._refreshing.discard(digest)
            if lookup.cancelled() or lookup.exception() is not None:
                return
            if self.cache.get(digest) is not cached:
                return
            record = lookup.result()
            if record is not None and verify_key(
                parsed.secret, record.key_hash, self.server_secret
            ):
                self._keep(digest, record)
            else:
                self.cache.invalidate(digest)
                self._last_good.pop(digest, None)

        self._lookup(parsed.prefix).add_done_callback(done)

    def _lookup(self, prefix: str) -> asyncio.Future[KeyRecord | None]:
        """The database's record of the key `prefix`, one query for all who ask at once.

        Why one: a cold gateway hit by many requests of a few keys at once (a restart under
        load; the fair-share e2e's 88 clients of two keys) sent one query per request,
        queued them all on the connection pool and timed them out together: 503s
        (`auth_unavailable`). Why a task of its own, awaited shielded: a caller's timeout
        ends its wait, never the query half way (SQLAlchemy then logged "Exception during
        reset" and threw the connection away); the query ends in its own time and its
        result serves whoever still waits. Each caller checks its own secret against it."""
        running = self._lookups.get(prefix)
        if running is not None:
            return running

        async def query() -> KeyRecord | None:
            async with self._database.session() as session:
                return await find_key_record(session, prefix)

        task = asyncio.ensure_future(query())
        self._lookups[prefix] = task

        def done(finished: asyncio.Future[KeyRecord | None]) -> None:
            del self._lookups[prefix]  # none replaces it while it runs
            if not finished.cancelled():
                finished.exception()  # read: nobody may be left waiting for it

        task.add_done_callback(done)
        return task

    def _remember(self, digest: str, record: KeyRecord) -> None:
        if len(self._last_good) >= LAST_GOOD_MAX and digest not in self._last_good:
            self._last_good.pop(next(iter(self._last_good)))
        self._last_good[digest] = (self._monotonic(), record)

    def _during_outage(self, digest: str, exc: BaseException) -> KeyRecord:
        """The database cannot be asked: a key verified within `OUTAGE_GRACE_S` keeps working
        (its record is the last one the database gave); any other key gets a 503, not a 500."""
        remembered = self._last_good.get(digest)
        if remembered is not None and self._monotonic() - remembered[0] <= OUTAGE_GRACE_S:
            if not self._outage_logged:
                self._outage_logged = True
                log.warning(
                    "key lookups failing: recently verified keys keep working",
                    extra={"error": type(exc).__name__},
                )
            return remembered[1]
        raise ServiceUnavailable(
            "authentication is temporarily unavailable; retry shortly",
            code="auth_unavailable",
            retry_after=2,
        ) from None

    async def start(self) -> None:
        """Store the bootstrap admin key (retried on use if the database is not there yet)
        and start recording keys' last-used times in the background."""
        await self.ensure_bootstrap_key()
        self._flusher = asyncio.create_task(self.last_used.run(), name="key-last-used")

    async def stop(self) -> None:
        flusher, self._flusher = self._flusher, None
        if flusher is not None:
            flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flusher
        try:
            await self.last_used.flush()
        except Exception as exc:  # shutting down with the database gone: lose a few times
            log.warning("could not record key last-used times at shutdown: %s", exc)

    async def ensure_bootstrap_key(self) -> bool:
        """Store the configured bootstrap admin key; False (and retried later) on failure."""
        if self._bootstrap is None or self._store_bootstrap is None:
            return True
        try:
            async with self._database.session() as session:
                await self._store_bootstrap(session, self.server_secret, self._bootstrap)
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
        project=record.project,
        key_quota=record.key_quota,
    )
