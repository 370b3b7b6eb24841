"""The `/ui` router: the pages, their static files and their HTML error pages.

Errors under `/ui` are pages, not the API's JSON error objects: the same
domain errors (404 for another tenant's object, 409 for a taken name) with a
message a person reads, and never a bare 500.
"""

from __future__ import annotations

import logging
from typing import Any

from litestar import Request, Response, Router
from litestar.di import Provide
from litestar.exceptions import HTTPException, ValidationException
from litestar.static_files import create_static_files_router
from litestar.types import ExceptionHandlersMap

from hydrant.platform.errors import DomainError
from hydrant.web.context import (
    AdminOnly,
    CsrfRefused,
    SignInRequired,
    page_without_session,
    provide_page,
    sign_in_url,
)
from hydrant.web.pages.batches import BatchPagesController
from hydrant.web.pages.credits import CreditPagesController
from hydrant.web.pages.invoices import InvoicePagesController
from hydrant.web.pages.keys import KeyPagesController
from hydrant.web.pages.models import ModelPagesController
from hydrant.web.pages.reports import ReportPagesController
from hydrant.web.pages.signin import SignInController
from hydrant.web.pages.tenants import TenantPagesController
from hydrant.web.rendering import STATIC

log = logging.getLogger(__name__)

_TITLES = {
    400: "That did not work",
    401: "Please sign in",
    403: "Not allowed",
    404: "Not found",
    405: "Not allowed",
    409: "Already exists",
    410: "Gone",
    413: "Too large",
    422: "That did not work",
    429: "Too many requests",
    503: "Temporarily unavailable",
}


def _error_page(request: Request[Any, Any, Any], status: int, message: str) -> Response[str]:
    page = page_without_session(request)
    title = _TITLES.get(status, "Something went wrong")
    return page.render("error.html", status=status, title=title, message=message)


def _on_domain_error(request: Request[Any, Any, Any], exc: Exception) -> Response[str]:
    assert isinstance(exc, DomainError)
    message = exc.message
    if exc.status == 404:
        message = "There is no such page, or it is not yours to see."
    return _error_page(request, exc.status, message)


def _on_sign_in_required(request: Request[Any, Any, Any], _: Exception) -> Response[str]:
    page = page_without_session(request)
    target = request.url.path if request.method == "GET" else "/ui/"
    return page.redirect(sign_in_url(target))


def _on_admin_only(request: Request[Any, Any, Any], _: Exception) -> Response[str]:
    return _error_page(request, 403, "This page needs an admin key; you signed in as a tenant.")


def _on_csrf(request: Request[Any, Any, Any], _: Exception) -> Response[str]:
    return _error_page(
        request,
        403,
        "The form was refused: its security token is missing or out of date."
        " Go back, reload the page and try again.",
    )


def _on_validation(request: Request[Any, Any, Any], exc: Exception) -> Response[str]:
    detail = getattr(exc, "detail", "") or "invalid request"
    return _error_page(request, 400, f"The request could not be read: {detail}")


def _on_http(request: Request[Any, Any, Any], exc: Exception) -> Response[str]:
    status = int(getattr(exc, "status_code", 500))
    if status >= 500:
        log.error("web page failed", extra={"path": request.url.path, "status": status})
        return _error_page(request, status, "Something went wrong on our side; try again.")
    return _error_page(request, status, str(getattr(exc, "detail", "")) or _TITLES.get(status, ""))


EXCEPTION_HANDLERS: ExceptionHandlersMap = {
    DomainError: _on_domain_error,
    SignInRequired: _on_sign_in_required,
    AdminOnly: _on_admin_only,
    CsrfRefused: _on_csrf,
    ValidationException: _on_validation,
    HTTPException: _on_http,
}


def web_router() -> Router:
    return Router(
        path="/ui",
        route_handlers=[
            SignInController,
            TenantPagesController,
            KeyPagesController,
            ModelPagesController,
            ReportPagesController,
            BatchPagesController,
            InvoicePagesController,
            CreditPagesController,
            create_static_files_router(
                path="/static", directories=[STATIC], name="web-static", include_in_schema=False
            ),
        ],
        dependencies={"page": Provide(provide_page)},
        exception_handlers=EXCEPTION_HANDLERS,
        include_in_schema=False,
    )
