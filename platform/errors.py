"""Domain errors: services raise these; only the app maps them to HTTP (platform/http/errors.py).

Each carries what an OpenAI-style error object needs (`type`, `code`,
`param`) so a refusal reads the same whether it came from auth, quotas,
billing or the engine, and a client library can branch on `code`.
"""

from __future__ import annotations


class DomainError(Exception):
    """Base of every refusal a client can receive; `status` is the HTTP status it maps to."""

    status = 400
    type = "invalid_request_error"
    default_code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code or self.default_code
        self.retry_after = retry_after
        self.headers = headers or {}  # extra response headers (a 429's rate-limit state)


class InvalidRequest(DomainError):
    default_code = "invalid_request"


class Unprocessable(DomainError):
    """Well-formed but cannot be served as asked (e.g. a prompt longer than the context)."""

    status = 422
    default_code = "unprocessable"


class PayloadTooLarge(DomainError):
    status = 413
    default_code = "payload_too_large"


class AuthenticationFailed(DomainError):
    """One message for every cause, so a response never reveals whether a key exists."""

    status = 401
    type = "authentication_error"
    default_code = "invalid_api_key"


class PermissionDenied(DomainError):
    status = 403
    type = "permission_error"
    default_code = "insufficient_scope"


class NotFound(DomainError):
    """Also what another tenant's object answers: existence is not revealed."""

    status = 404
    default_code = "not_found"


class Conflict(DomainError):
    status = 409
    default_code = "conflict"


class RateLimited(DomainError):
    status = 429
    type = "rate_limit_error"
    default_code = "rate_limit_exceeded"


class BudgetExhausted(DomainError):
    status = 429
    type = "insufficient_quota"
    default_code = "budget_exhausted"


class InsufficientQuota(DomainError):
    """A prepaid tenant's credits cannot cover the request: OpenAI's own refusal for an
    account out of credit (429, type and code `insufficient_quota`)."""

    status = 429
    type = "insufficient_quota"
    default_code = "insufficient_quota"


class ServiceUnavailable(DomainError):
    status = 503
    type = "server_error"
    default_code = "service_unavailable"


class ClientDisconnected(DomainError):
    """The client closed the connection before its answer was ready: the work was stopped.

    Nobody reads this answer; 499 (nginx's "client closed request") marks it in the
    server's own records."""

    status = 499
    default_code = "client_closed_request"
