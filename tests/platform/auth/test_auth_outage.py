"""With the database away, recently verified keys keep working and others get a 503, never a 500."""

from __future__ import annotations

import pytest
from control_plane_helpers import ControlPlane

from hydrant.platform.db.session import Database
from hydrant.platform.errors import ServiceUnavailable


async def test_keys_during_a_database_outage(cp: ControlPlane) -> None:
    _, known = await cp.tenant_with_key("acme")
    _, unseen = await cp.tenant_with_key("beta")
    auth = cp.authenticator
    await cp.in_app(lambda: auth.authenticate(f"Bearer {known}", "inference"))
    cp.clock.advance(60)  # past the cache TTL: the next lookup would ask the database
    real = auth._database
    away = Database("postgresql+asyncpg://nobody@127.0.0.1:1/none")
    auth._database = away
    try:
        principal = await cp.in_app(lambda: auth.authenticate(f"Bearer {known}", "inference"))
        assert principal.key_prefix and known.startswith(principal.key_prefix)
        with pytest.raises(ServiceUnavailable) as refused:
            await cp.in_app(lambda: auth.authenticate(f"Bearer {unseen}", "inference"))
        assert refused.value.status == 503 and refused.value.retry_after
        cp.clock.advance(400)  # past the outage grace: even the known key is refused
        with pytest.raises(ServiceUnavailable):
            await cp.in_app(lambda: auth.authenticate(f"Bearer {known}", "inference"))
    finally:
        auth._database = real
        await cp.in_app(away.dispose)
