"""With the database away, recently verified keys keep working and others get a 503, never a 500."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from control_plane_helpers import ControlPlane
from sqlalchemy import event

from hydrant.platform.db.session import Database
from hydrant.platform.errors import AuthenticationFailed, ServiceUnavailable


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


async def test_a_cold_burst_of_one_key_asks_the_database_once(cp: ControlPlane) -> None:
    """Many requests of one key on a cold cache (a gateway restarted under load): one query
    for all of them, not one each (which queued them all on the pool and timed them out
    together); every caller still gets its own answer, a wrong secret its own refusal."""
    _, secret = await cp.tenant_with_key("acme")
    auth = cp.authenticator
    cp.clock.advance(60)  # past the cache TTL: lookups go to the database
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "api_keys" in statement:
            statements.append(statement)

    engine = auth._database.engine.sync_engine
    event.listen(engine, "before_cursor_execute", count)
    wrong = secret[:-4] + ("aaaa" if not secret.endswith("aaaa") else "bbbb")

    async def burst() -> list[Any]:
        calls = [auth.authenticate(f"Bearer {secret}", "inference") for _ in range(40)]
        calls.append(auth.authenticate(f"Bearer {wrong}", "inference"))
        return await asyncio.gather(*calls, return_exceptions=True)

    try:
        results = await cp.in_app(burst)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert len(statements) == 1, statements
    assert all(r.key_prefix and secret.startswith(r.key_prefix) for r in results[:40])
    assert isinstance(results[40], AuthenticationFailed)
