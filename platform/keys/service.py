"""API keys in the database: create (secret shown once), list, revoke, rotate with grace.

Only the HMAC-SHA256 of a key and its public prefix are stored; the secret
exists in memory for the length of the request that creates it. Tenant keys
carry the `inference` scope; admin keys have no tenant and carry `admin` (an
admin key cannot run inference: there would be nobody to bill).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.invalidation import CacheInvalidator, no_cache
from hydrant.platform.auth.key_codec import KeyEnv, ParsedKey, generate_key, parse_key
from hydrant.platform.auth.key_hashing import hash_key
from hydrant.platform.auth.principal import ADMIN_SCOPE, INFERENCE_SCOPE, Principal
from hydrant.platform.db.base import utcnow
from hydrant.platform.db.models import ApiKey
from hydrant.platform.errors import Conflict, InvalidRequest, NotFound, PermissionDenied
from hydrant.platform.keys import repository
from hydrant.platform.keys.schemas import KEY_BUDGETS, MAX_GRACE_S, key_status
from hydrant.platform.prices.decimal_text import parse_decimal
from hydrant.platform.projects.service import ProjectService
from hydrant.platform.tenants import repository as tenants

log = logging.getLogger(__name__)

PREFIX_ATTEMPTS = 5  # a prefix collision (62**8 space) is rare; a second draw settles it


def _budget_columns(
    rotated_from: ApiKey | None, budgets: Mapping[str, object] | None
) -> dict[str, object]:
    """A new key's budget columns: those given, else its predecessor's (rotation)."""
    if budgets is None:
        return {n: getattr(rotated_from, n) if rotated_from else None for n in KEY_BUDGETS}
    return _parsed_budgets({name: budgets.get(name) for name in KEY_BUDGETS})


def _parsed_budgets(values: Mapping[str, object]) -> dict[str, object]:
    """Budget columns from given values: money parsed from decimal text (6 places, what
    the column holds), token counts whole and not negative; a 400 naming the field."""
    parsed = dict(values)
    for name, value in values.items():
        if name not in KEY_BUDGETS:
            raise InvalidRequest(f"{name} is not a key budget", param=name)
        if value is None:
            continue
        if name.startswith("spend_"):
            if not isinstance(value, str | int) or isinstance(value, bool):
                raise InvalidRequest(f"{name} must be a decimal string", param=name)
            parsed[name] = parse_decimal(value, param=name, places=6, integer_digits=14)
        elif not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidRequest(f"{name} must be a whole number of tokens, 0 or more", param=name)
    return parsed


class KeyService:
    def __init__(
        self,
        session: AsyncSession,
        *,
        server_secret: bytes,
        key_env: KeyEnv = "live",
        cache: CacheInvalidator = no_cache,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._session = session
        self._secret = server_secret
        self._env = key_env
        self._cache = cache
        self._clock = clock
        self._projects = ProjectService(session, cache=cache)

    def now(self) -> datetime:
        return self._clock()

    async def create(
        self,
        principal: Principal,
        *,
        tenant_id: str | None,
        name: str = "",
        expires_at: datetime | None = None,
        rotated_from: ApiKey | None = None,
        project: str | None = None,
        budgets: Mapping[str, object] | None = None,
    ) -> tuple[ApiKey, str]:
        """A new key and its secret (the only time the secret is available). `project`: the
        tenant's active project it belongs to (id or name); `budgets`: the key's own
        (`KEY_BUDGETS`, money as decimal text). A rotated key keeps its project and budgets."""
        self._require_admin(principal)
        if expires_at is not None and expires_at <= self.now():
            raise InvalidRequest("expires_at is in the past", param="expires_at")
        if tenant_id is not None:
            tenant = await tenants.get_tenant(self._session, principal, tenant_id)
            if tenant is None:
                raise NotFound(f"no tenant {tenant_id!r}", param="tenant_id")
        project_id = rotated_from.project_id if rotated_from is not None else None
        if project is not None:
            if tenant_id is None:
                raise InvalidRequest("an admin key belongs to no project", param="project")
            project_id = (await self._projects.for_new_key(principal, tenant_id, project)).id
        limits = _budget_columns(rotated_from, budgets)
        if tenant_id is None and any(v is not None for v in limits.values()):
            raise InvalidRequest("an admin key has no budgets", param="tokens_per_day")
        scope = INFERENCE_SCOPE if tenant_id is not None else ADMIN_SCOPE
        for _ in range(PREFIX_ATTEMPTS):
            generated = generate_key(self._env)
            if await repository.key_by_prefix(self._session, generated.prefix) is None:
                break
        else:  # pragma: no cover - needs PREFIX_ATTEMPTS collisions in a 62**8 space
            raise Conflict("could not draw an unused key prefix; try again")
        key = ApiKey(
            tenant_id=tenant_id,
            name=name.strip(),
            prefix=generated.prefix,
            key_hash=hash_key(generated.secret, self._secret),
            scopes=scope,
            expires_at=expires_at,
            rotated_from_id=rotated_from.id if rotated_from is not None else None,
            project_id=project_id,
            created_at=self.now(),
            **limits,
        )
        self._session.add(key)
        await self._flush()
        log.info("api key created", extra={"key_id": key.id, "prefix": key.prefix})
        return key, generated.secret

    async def get(self, principal: Principal, key_id: str) -> ApiKey:
        key = await repository.get_key(self._session, principal, key_id)
        if key is None:
            raise NotFound(f"no API key {key_id!r}", param="key_id")
        return key

    async def list(
        self,
        principal: Principal,
        *,
        tenant_id: str | None = None,
        admin_keys: bool = False,
        limit: int = 50,
        after: str | None = None,
    ) -> tuple[Sequence[ApiKey], bool]:
        """Keys the principal may see; `tenant_id` narrows, `admin_keys` lists admin keys."""
        return await repository.list_keys(
            self._session,
            principal,
            tenant_id=tenant_id,
            admin_keys=admin_keys,
            limit=limit,
            after=after,
        )

    async def revoke(self, principal: Principal, key_id: str) -> ApiKey:
        """Stop a key now (idempotent: revoking twice keeps the first time)."""
        self._require_admin(principal)
        key = await self._locked(principal, key_id)
        if key.revoked_at is None:
            key.revoked_at = self.now()
            await self._flush()
            log.info("api key revoked", extra={"key_id": key.id, "prefix": key.prefix})
        self._cache.invalidate(key.key_hash)
        return key

    async def update_budgets(
        self, principal: Principal, key_id: str, budgets: Mapping[str, object]
    ) -> ApiKey:
        """Set or clear (None) a key's own budgets; those not given are unchanged.

        The next request checks the new limits against the same period counters (a
        budget lowered under what the key used already refuses at once; one raised
        admits at once). The principal cached by this gateway carries the old ones, so
        it is dropped here; other gateways drop theirs within the key cache's TTL. A key
        that no longer authenticates (revoked, expired, rotated) is not changed: 409.
        """
        self._require_admin(principal)
        values = _parsed_budgets(budgets)
        key = await self._locked(principal, key_id)
        if key.tenant_id is None and values:
            raise InvalidRequest("an admin key has no budgets", param=next(iter(values)))
        status = key_status(key, self.now())
        if status not in ("active", "rotating"):
            raise Conflict(f"only a key in use can change its budgets; this one is {status}")
        for name, value in values.items():
            setattr(key, name, value)
        await self._flush()
        self._cache.invalidate(key.key_hash)
        log.info("api key budgets changed", extra={"key_id": key.id, "budgets": sorted(values)})
        return key

    async def rotate(
        self,
        principal: Principal,
        key_id: str,
        *,
        grace: timedelta,
        expires_at: datetime | None = None,
    ) -> tuple[ApiKey, str, ApiKey]:
        """A successor key; the old one keeps working for `grace`, then stops.

        Returns (new key, its secret, old key). A key that is not active (revoked,
        expired, or already rotated) cannot be rotated: 409.
        """
        self._require_admin(principal)
        if not timedelta(0) <= grace <= timedelta(seconds=MAX_GRACE_S):
            raise InvalidRequest("grace must be between 0 and 30 days", param="grace_seconds")
        old = await self._locked(principal, key_id)
        now = self.now()
        status = key_status(old, now)
        if status != "active" or await repository.successor_of(self._session, old.id):
            raise Conflict(f"only an active key can be rotated; this one is {status}")
        new, secret = await self.create(
            principal,
            tenant_id=old.tenant_id,
            name=old.name,
            expires_at=expires_at,
            rotated_from=old,
        )
        old.grace_until = now + grace
        await self._flush()
        if grace == timedelta(0):
            self._cache.invalidate(old.key_hash)
        log.info("api key rotated", extra={"key_id": old.id, "successor": new.id})
        return new, secret, old

    async def adopt_admin_key(self, secret: str, name: str = "bootstrap") -> ApiKey | None:
        """Store a configured admin key (the bootstrap key) if it is not stored yet.

        A stored key is left alone, even when revoked: revoking the bootstrap key
        must survive a restart. Returns None when another key holds its prefix.
        """
        parsed = parse_key(secret)
        digest = hash_key(parsed.secret, self._secret)
        existing = await repository.key_by_prefix(self._session, parsed.prefix)
        if existing is not None:
            if existing.key_hash != digest or existing.tenant_id is not None:
                log.error("the bootstrap key's prefix belongs to another key; not adopted")
                return None
            return existing
        key = ApiKey(
            tenant_id=None,
            name=name,
            prefix=parsed.prefix,
            key_hash=digest,
            scopes=ADMIN_SCOPE,
            created_at=self.now(),
        )
        self._session.add(key)
        await self._flush()
        log.info("bootstrap admin key stored", extra={"key_id": key.id, "prefix": key.prefix})
        return key

    async def _locked(self, principal: Principal, key_id: str) -> ApiKey:
        key = await repository.get_key_for_update(self._session, principal, key_id)
        if key is None:
            raise NotFound(f"no API key {key_id!r}", param="key_id")
        return key

    @staticmethod
    def _require_admin(principal: Principal) -> None:
        if not principal.is_admin:
            raise PermissionDenied("only an admin key can manage API keys")

    async def _flush(self) -> None:
        try:
            await self._session.flush()
        except IntegrityError:
            raise Conflict("the key conflicts with another one; try again") from None


async def store_bootstrap_key(session: AsyncSession, server_secret: bytes, key: ParsedKey) -> None:
    """The authenticator's way to store the configured bootstrap admin key (idempotent)."""
    await KeyService(session, server_secret=server_secret).adopt_admin_key(key.secret)
