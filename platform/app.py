"""The gateway's Litestar application: one list of controllers, one services object.

`create_app` is the only place routes are registered (`controllers`) and the
only place services are handed to handlers (`dependencies`, by `Provide`);
`app.state` holds the services object alone. Services are built from
settings by `build_services` (services.py), or passed in built, so tests and
the embedded mode choose the backends and two apps can live in one process.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from litestar import Litestar, Router
from litestar.datastructures import State
from litestar.di import Provide
from litestar.types import ControllerRouterHandler

from hydrant.platform.adapters.controllers import AdapterAdminController
from hydrant.platform.auth.context import SERVICES_STATE_KEY
from hydrant.platform.auth.dependencies import (
    provide_db_session,
    provide_inference_principal,
    require_inference,
)
from hydrant.platform.batches.controllers import BatchesController
from hydrant.platform.credits.controllers import AccountBalanceController, CreditAdminController
from hydrant.platform.digests.controllers import (
    DigestAdminController,
    StuckDigestController,
    UnsubscribeController,
)
from hydrant.platform.digests.deps import provide_digest_service
from hydrant.platform.dispatch.controllers import PoolAdminController
from hydrant.platform.dispatch.sleep_mode import SleepModeController
from hydrant.platform.engines.controllers import EngineAdminController
from hydrant.platform.files.controllers import MULTIPART_OVERHEAD_BYTES, FilesController
from hydrant.platform.health.controllers import HealthController
from hydrant.platform.http.errors import EXCEPTION_HANDLERS
from hydrant.platform.http.hardening import cors_config, hardening_middleware
from hydrant.platform.http.openapi import declare_error_responses, openapi_config
from hydrant.platform.http.request_id import add_request_id_header
from hydrant.platform.inference.chat.controllers import CHAT, ChatController
from hydrant.platform.inference.completions.controllers import TEXT, CompletionsController
from hydrant.platform.inference.embeddings.controllers import (
    EMBEDDINGS,
    EmbeddingsController,
    ScoringController,
)
from hydrant.platform.inference.lean_path import lean_path
from hydrant.platform.inference.models.controllers import ModelsController
from hydrant.platform.inference.responses.controllers import RESPONSES, ResponsesController
from hydrant.platform.inference.serving import Endpoint
from hydrant.platform.inference.tokenization.controllers import TokenizationController
from hydrant.platform.invoices.controllers import (
    AccountInvoicesController,
    InvoiceAdminController,
    InvoiceFinalizeController,
)
from hydrant.platform.keys.controllers import AccountKeysController, KeyAdminController
from hydrant.platform.metrics import bearer_token_guard, metrics_route
from hydrant.platform.prices.controllers import PriceBookController
from hydrant.platform.projects.controllers import AccountProjectsController, ProjectAdminController
from hydrant.platform.reconciliation.controllers import ReconciliationController
from hydrant.platform.reports.controllers import CostReportController, UsageController
from hydrant.platform.reports.organization_api import OrganizationUsageController
from hydrant.platform.services import Services, build_services
from hydrant.platform.tenants.controllers import (
    AccountController,
    PlanAdminController,
    TenantAdminController,
)
from hydrant.platform.usage_export.controllers import BillingCustomerController
from hydrant.settings import Settings
from hydrant.web import web_routes

# The `/v1` API (and vLLM's extra paths), behind a tenant key with the `inference` scope.
INFERENCE_CONTROLLERS = (
    ModelsController,
    ChatController,
    CompletionsController,
    ResponsesController,
    EmbeddingsController,
    ScoringController,
    TokenizationController,
    BatchesController,
)

# What the lean path answers (inference/lean_path.py), by path: each route's own endpoint,
# as its handler serves it (the arrival-order gate's paths: http/ingest.py).
LEAN_ROUTES: dict[str, Endpoint] = {
    "/v1/completions": TEXT,
    "/v1/chat/completions": CHAT,
    "/v1/embeddings": EMBEDDINGS,
    "/v1/responses": RESPONSES,
}


def controllers(services: Services) -> list[ControllerRouterHandler]:
    """Every route of the app, in one list: what a gateway with these services serves."""
    settings = services.settings
    handlers: list[ControllerRouterHandler] = [
        HealthController,
        TenantAdminController,
        PlanAdminController,
        KeyAdminController,
        PriceBookController,
        AdapterAdminController,  # /admin/models/{base}/adapters
        AccountController,
        AccountKeysController,
        CreditAdminController,
        AccountBalanceController,
        AccountInvoicesController,  # /account/invoices: a tenant's drafts and invoices
        InvoiceAdminController,  # /admin/tenants/{id}/invoices
        InvoiceFinalizeController,  # POST /admin/invoices/finalize?month=YYYY-MM
        BillingCustomerController,  # /admin/tenants/{id}/billing-customer (usage export)
        ProjectAdminController,  # /admin/tenants/{id}/projects (attribution, budgets)
        AccountProjectsController,  # /account/projects: a tenant's own
        CostReportController,
        ReconciliationController,  # /admin/reports/reconciliation?day=YYYY-MM-DD (issue #26)
        UsageController,
        OrganizationUsageController,  # OpenAI's /v1/organization usage and costs (admin keys)
        DigestAdminController,  # /admin/tenants/{id}/digest
        StuckDigestController,
        UnsubscribeController,  # /digests/unsubscribe (a signed link, no key)
        metrics_route(
            services.metric_registries,
            guards=[bearer_token_guard(settings.metrics_token)] if settings.metrics_token else (),
        ),
        *web_routes(),  # `/ui`: the admin and tenant pages (hydrant.web)
    ]
    inference = services.inference
    if inference is not None:
        handlers.append(
            Router(path="/", route_handlers=list(INFERENCE_CONTROLLERS), guards=[require_inference])
        )
        # Uploads are larger than any request body: their own router, their own limit.
        handlers.append(
            Router(
                path="/",
                route_handlers=[FilesController],
                guards=[require_inference],
                request_max_body_size=settings.files_max_bytes + MULTIPART_OVERHEAD_BYTES,
            )
        )
        handlers.append(EngineAdminController)  # /admin/engines: limits and KV state
        if inference.pools is not None and not inference.pools.embedded:
            handlers.append(PoolAdminController)  # /admin/pools: workers, hot swap
        if inference.pools is not None:
            handlers.append(SleepModeController)  # vLLM's /sleep, /wake_up, /is_sleeping
    return handlers


def _constant(value: object) -> Provide:
    """A service built once: the same object for every request."""

    def provide() -> Any:
        return value

    return Provide(provide, use_cache=True, sync_to_thread=False)


def dependencies(services: Services) -> dict[str, Provide]:
    """Every service a handler can ask for, by parameter name. `principal` is the
    inference principal here; admin controllers override it with the admin one."""
    provided: dict[str, Callable[..., Any] | object] = {
        "settings": services.settings,
        "database": services.database,
        "authenticator": services.authenticator,
        "mailer": services.mailer,
        "served_models": services.models,
        "runtime": services.runtime,
        "files": services.files,
        # The gateway's adapter catalog, told of admin changes at once (None: no `/v1` here).
        "adapter_catalog": services.inference.adapters if services.inference else None,
    }
    deps = {name: _constant(value) for name, value in provided.items()}
    deps["db_session"] = Provide(provide_db_session)
    deps["principal"] = Provide(provide_inference_principal)
    deps["digests"] = Provide(provide_digest_service)
    if services.inference is not None:
        deps["inference"] = _constant(services.inference.api)
        deps["batches"] = _constant(services.inference.batches)
        if services.inference.pools is not None:
            deps["engine_pools"] = _constant(services.inference.pools)  # embedded ones too
            if not services.inference.pools.embedded:
                deps["pools"] = _constant(services.inference.pools)
    return deps


def create_app(settings: Settings, services: Services | None = None) -> Litestar:
    """The app for `settings`: with `services` as built (`build_services`), else built here
    (the control plane alone: no engines, so no `/v1`, unless worker pools are configured)."""
    built = services or build_services(settings)
    middleware = hardening_middleware(settings)  # header size, slow request bodies
    # HYDRANT_LEAN_PATH=false leaves the generation routes to their Litestar handlers alone
    if settings.lean_path and built.inference is not None:
        middleware.append(lean_path(built.inference.api, LEAN_ROUTES))  # innermost

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        await built.start()
        try:
            yield
        finally:
            await built.stop()

    app = Litestar(
        route_handlers=controllers(built),
        dependencies=dependencies(built),
        lifespan=[lifespan],
        before_send=[add_request_id_header],
        exception_handlers=EXCEPTION_HANDLERS,
        request_max_body_size=settings.max_request_body_bytes,
        middleware=middleware,
        cors_config=cors_config(settings),  # None (closed) unless HYDRANT_CORS_ORIGINS names some
        openapi_config=openapi_config(),  # /schema/openapi.json: routes and shapes, no secrets
        logging_config=None,  # logging is ours (hydrant.logs): redacted, one handler
        debug=False,
        state=State({SERVICES_STATE_KEY: built}),  # guards run before injection: see auth.context
    )
    declare_error_responses(app)  # every error is an OpenAI error object, in the schema too
    return app
