"""What checking a request's key needs, and where guards find it.

Guards run before dependency injection (a route's guards have only the
connection), so they cannot be handed services by `Provide`. The app's one
services object (`hydrant.platform.services.Services`) is the only thing in
`app.state`; it holds an `AuthContext`, and `auth_context()` is the one place
that reads it. Everything else gets its services injected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from litestar import Litestar

from hydrant.platform.auth.brute_force import BruteForceGuard
from hydrant.platform.auth.service import Authenticator
from hydrant.platform.http.client_address import Network

SERVICES_STATE_KEY = "services"


@dataclass
class AuthContext:
    authenticator: Authenticator
    brute_force: BruteForceGuard | None
    trusted_proxies: tuple[Network, ...] = ()


class _HoldsAuth(Protocol):
    auth: AuthContext


def auth_context(app: Litestar) -> AuthContext:
    services: _HoldsAuth = getattr(app.state, SERVICES_STATE_KEY)
    return services.auth


def authenticator_of(app: Litestar) -> Authenticator:
    return auth_context(app).authenticator
