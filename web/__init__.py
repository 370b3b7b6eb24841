"""Server-rendered admin and tenant pages, served by the gateway under `/ui`.

`web_routes()` is the one thing the app imports from here: the web pages
depend on the platform's services, never the other way round.
"""

from __future__ import annotations

from litestar import Router


def web_routes() -> list[Router]:
    """The routers to mount in the gateway (imported lazily: the platform loads first)."""
    from hydrant.web.routes import web_router

    return [web_router()]
