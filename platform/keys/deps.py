"""How the key service is made: one place for the admin API, the account API and the console.

A key is hashed under the authenticator's server secret and dropped from its
cache when revoked, so the service is always made from the process's one
authenticator.
"""

from __future__ import annotations

from litestar.di import NamedDependency
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.service import Authenticator
from hydrant.platform.keys.service import KeyService
from hydrant.settings import Settings


async def provide_key_service(
    db_session: NamedDependency[AsyncSession],
    authenticator: NamedDependency[Authenticator],
    settings: NamedDependency[Settings],
) -> KeyService:
    return KeyService(
        db_session,
        server_secret=authenticator.server_secret,
        key_env=settings.key_env,
        cache=authenticator.cache,
        clock=authenticator.clock,
    )
