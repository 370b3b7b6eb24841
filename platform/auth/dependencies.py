"""Litestar providers and guards: the principal of a request, and its unit of work.

Guards run before the body is parsed, so an anonymous request is a 401 even
when its body is malformed; the providers hand the handler the principal the
guard found (authenticating only once per request).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.di import NamedDependency
from litestar.handlers.base import BaseRouteHandler
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.context import auth_context
from hydrant.platform.auth.principal import ADMIN_SCOPE, INFERENCE_SCOPE, Principal
from hydrant.platform.auth.service import INVALID_KEY
from hydrant.platform.db.session import Database
from hydrant.platform.errors import AuthenticationFailed
from hydrant.platform.http.client_address import client_address

_STATE_KEY = "hydrant_principal"


async def _principal(connection: ASGIConnection[Any, Any, Any, Any], scope: str) -> Principal:
    cached = connection.scope.get("state", {}).get(_STATE_KEY)
    if isinstance(cached, Principal) and scope in cached.scopes:
        return cached
    principal = await authenticate_guarded(
        connection, connection.headers.get("authorization"), scope
    )
    connection.scope.setdefault("state", {})[_STATE_KEY] = principal
    return principal


async def authenticate_guarded(
    connection: ASGIConnection[Any, Any, Any, Any], authorization: str | None, scope: str
) -> Principal:
    """Authenticate `authorization` under the brute-force guard of the connection's source.

    Every place that checks a key a client sent (the bearer header, a sign-in
    form) goes through here, so guesses count wherever they are made.
    """
    auth = auth_context(connection.app)
    guard = auth.brute_force
    source = client_address(connection.scope, auth.trusted_proxies)
    if guard is not None:
        await guard.check(source)
    try:
        return await auth.authenticator.authenticate(authorization, scope)
    except AuthenticationFailed as exc:
        if guard is not None and exc.message == INVALID_KEY:  # a key was tried, and it was wrong
            await guard.record_failure(source)
        raise


async def provide_inference_principal(request: Request[Any, Any, Any]) -> Principal:
    """The caller of a `/v1` route: a tenant key with the `inference` scope."""
    return await _principal(request, INFERENCE_SCOPE)


async def provide_admin_principal(request: Request[Any, Any, Any]) -> Principal:
    """The caller of an `/admin` route: an admin key."""
    return await _principal(request, ADMIN_SCOPE)


async def require_inference(
    connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
) -> None:
    await _principal(connection, INFERENCE_SCOPE)


async def require_admin(
    connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
) -> None:
    await _principal(connection, ADMIN_SCOPE)


async def provide_db_session(database: NamedDependency[Database]) -> AsyncIterator[AsyncSession]:
    """One unit of work per request: committed after the handler, rolled back if it raises."""
    async with database.session() as session:
        yield session
