"""The authenticator made from settings, and the start-up checks of those settings.

Why apart from `service.py`: reading and refusing settings is start-up work
(`hydrant serve` runs the checks before it loads any model), while the
authenticator itself is the hot path of every request.
"""

from __future__ import annotations

from hydrant.errors import ConfigurationError
from hydrant.platform.auth.key_cache import MAX_TTL_S
from hydrant.platform.auth.key_codec import MalformedKeyError, ParsedKey, parse_key
from hydrant.platform.auth.service import Authenticator, StoreBootstrapKey
from hydrant.platform.db.session import Database
from hydrant.platform.server_secret import load_server_secret
from hydrant.settings import Settings


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


def build_authenticator(
    settings: Settings, database: Database, store_bootstrap_key: StoreBootstrapKey | None
) -> Authenticator:
    """`store_bootstrap_key` is key management's rule (keys.service), handed in by the
    assembly so that authentication imports no other domain."""
    key = bootstrap_key(settings)
    return Authenticator(
        database,
        lambda: load_server_secret(settings),
        cache_ttl_s=cache_ttl(settings),
        bootstrap_key=key,
        store_bootstrap_key=store_bootstrap_key if key is not None else None,
    )
