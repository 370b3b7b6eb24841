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
from litestar.datastructures import State
from litestar.handlers.base import BaseRouteHandler
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.principal import ADMIN_SCOPE, INFERENCE_SCOPE, Principal
from hydrant.platform.auth.service import Authenticator
from hydrant.platform.db.session import Database

_STATE_KEY = "hydrant_principal"


def authenticator_of(state: State) -> Authenticator:
    authenticator: Authenticator = state.authenticator
    return authenticator


async def _principal(connection: ASGIConnection[Any, Any, Any, Any], scope: str) -> Principal:
    cached = connection.scope.get("state", {}).get(_STATE_KEY)
    if isinstance(cached, Principal) and scope in cached.scopes:
        return cached
    authenticator = authenticator_of(connection.app.state)
    principal = await authenticator.authenticate(connection.headers.get("authorization"), scope)
    connection.scope.setdefault("state", {})[_STATE_KEY] = principal
    return principal


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


async def provide_db_session(state: State) -> AsyncIterator[AsyncSession]:
    """One unit of work per request: committed after the handler, rolled back if it raises."""
    database: Database = state.database
    async with database.session() as session:
        yield session
