"""Wires the control plane into the app: auth, the unit of work, the admin and account routes.

One plugin so `create_app` stays a list of parts: it registers the routes of
tenants, plans, keys and the price book, the app-wide dependencies
(`db_session`, and `principal` = the inference principal, which admin
controllers override with the admin one), the authenticator in
`app.state.authenticator`, and a lifespan that stores the bootstrap admin key
and flushes key last-used times in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from litestar import Litestar
from litestar.config.app import AppConfig
from litestar.di import Provide
from litestar.plugins import InitPluginProtocol

from hydrant.errors import ConfigurationError
from hydrant.platform.auth.dependencies import provide_db_session, provide_inference_principal
from hydrant.platform.auth.secret import load_server_secret
from hydrant.platform.auth.service import Authenticator
from hydrant.platform.db.session import Database
from hydrant.platform.keys.cache import MAX_TTL_S
from hydrant.platform.keys.codec import MalformedKeyError, ParsedKey, parse_key
from hydrant.platform.keys.controllers import AccountKeysController, KeyAdminController
from hydrant.platform.prices.controllers import PriceBookController
from hydrant.platform.tenants.controllers import (
    AccountController,
    PlanAdminController,
    TenantAdminController,
)
from hydrant.settings import Settings

log = logging.getLogger(__name__)

CONTROLLERS = (
    TenantAdminController,
    PlanAdminController,
    KeyAdminController,
    PriceBookController,
    AccountController,
    AccountKeysController,
)


def bootstrap_key(settings: Settings) -> ParsedKey | None:
    """The configured bootstrap admin key, refused at start-up when it is not a valid key."""
    if settings.admin_bootstrap_key is None:
        return None
    try:
        return parse_key(settings.admin_bootstrap_key.strip())
    except MalformedKeyError as exc:
        raise ConfigurationError(
            f"HYDRANT_ADMIN_BOOTSTRAP_KEY is not a valid Hydrant key ({exc}); make one with"
            ' python -c "from hydrant.platform.keys import generate_key;'
            ' print(generate_key().secret)"'
        ) from None


def cache_ttl(settings: Settings) -> float:
    try:
        ttl = float(settings.key_cache_ttl_s)
    except (TypeError, ValueError):
        raise ConfigurationError("HYDRANT_KEY_CACHE_TTL_S must be a number of seconds") from None
    if not 0 < ttl <= MAX_TTL_S:
        raise ConfigurationError(f"HYDRANT_KEY_CACHE_TTL_S must be in (0, {MAX_TTL_S}]")
    return ttl


def check_auth_settings(settings: Settings) -> None:
    """Raise ConfigurationError now for an auth setting the app would refuse later.

    `hydrant serve` calls it before it loads any model, so a mistyped bootstrap
    key costs a second, not a model load (minutes for a large checkpoint).
    """
    bootstrap_key(settings)
    cache_ttl(settings)


def build_authenticator(settings: Settings, database: Database) -> Authenticator:
    return Authenticator(
        database,
        lambda: load_server_secret(settings),
        cache_ttl_s=cache_ttl(settings),
        bootstrap_key=bootstrap_key(settings),
    )


@contextlib.asynccontextmanager
async def control_plane_lifespan(app: Litestar) -> AsyncIterator[None]:
    authenticator: Authenticator = app.state.authenticator
    await authenticator.ensure_bootstrap_key()
    flusher = asyncio.create_task(authenticator.last_used.run(), name="key-last-used")
    try:
        yield
    finally:
        flusher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flusher
        try:
            await authenticator.last_used.flush()
        except Exception as exc:  # shutting down with the database gone: lose a few times
            log.warning("could not record key last-used times at shutdown: %s", exc)


class ControlPlanePlugin(InitPluginProtocol):
    def __init__(self, settings: Settings, database: Database) -> None:
        self.authenticator = build_authenticator(settings, database)

    def on_app_init(self, app_config: AppConfig) -> AppConfig:
        app_config.route_handlers.extend(CONTROLLERS)
        app_config.dependencies.setdefault("db_session", Provide(provide_db_session))
        app_config.dependencies.setdefault("principal", Provide(provide_inference_principal))
        app_config.state["authenticator"] = self.authenticator
        app_config.lifespan.append(control_plane_lifespan)
        return app_config
