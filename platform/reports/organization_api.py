"""Routes: OpenAI's `GET /v1/organization/usage/completions` and `/v1/organization/costs`.

Admin keys only, as OpenAI's are (an inference key gets the 403 `insufficient_scope`
error in OpenAI's shape). Bodies follow OpenAI's: a `page` of `bucket`s with their
`results`. A cost's `amount.value` is a JSON number, as OpenAI sends it, but written
from the exact Decimal sum (never through a float), so it equals the ledger's rows to
the micro-unit.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Controller, Request, Response, get
from litestar.di import NamedDependency, Provide
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.dependencies import provide_admin_principal, require_admin
from hydrant.platform.auth.principal import Principal
from hydrant.platform.db.base import utcnow
from hydrant.platform.reports.organization import (
    COSTS_GROUPS,
    COSTS_LIMITS,
    USAGE_GROUPS,
    USAGE_LIMITS,
    OrgBucket,
    OrgPage,
    build_org_query,
    read_page,
)

_ENCODER = msgspec.json.Encoder(decimal_format="number")
USAGE_RESULT = "organization.usage.completions.result"
COSTS_RESULT = "organization.costs.result"


def _params(request: Request[Any, Any, Any]) -> dict[str, list[str]]:
    return {key: request.query_params.getall(key) for key in request.query_params}


def _usage_bucket(bucket: OrgBucket) -> dict[str, Any]:
    return {
        "object": "bucket",
        "start_time": bucket.start,
        "end_time": bucket.end,
        "results": [
            {
                "object": USAGE_RESULT,
                "input_tokens": r.input_tokens,
                "output_tokens": r.output_tokens,
                "input_cached_tokens": r.input_cached_tokens,
                "input_audio_tokens": 0,
                "output_audio_tokens": 0,
                "num_model_requests": r.num_model_requests,
                "project_id": r.project_id,
                "user_id": r.user_id,
                "api_key_id": r.api_key_id,
                "model": r.model,
                "batch": r.batch,
            }
            for r in bucket.usage
        ],
    }


def _costs_bucket(bucket: OrgBucket) -> dict[str, Any]:
    return {
        "object": "bucket",
        "start_time": bucket.start,
        "end_time": bucket.end,
        "results": [
            {
                "object": COSTS_RESULT,
                "amount": {"value": r.amount, "currency": r.currency},
                "line_item": r.line_item,
                "project_id": r.project_id,
            }
            for r in bucket.costs
        ],
    }


def _page(page: OrgPage, kind: str) -> Response[bytes]:
    shape = _usage_bucket if kind == "usage" else _costs_bucket
    body = {
        "object": "page",
        "data": [shape(b) for b in page.buckets],
        "has_more": page.next_page is not None,
        "next_page": page.next_page,
    }
    return Response(_ENCODER.encode(body), media_type="application/json")


class OrganizationUsageController(Controller):
    path = "/v1/organization"
    guards = [require_admin]
    dependencies = {"principal": Provide(provide_admin_principal)}

    @get("/usage/completions")
    async def usage_completions(
        self,
        request: Request[Any, Any, Any],
        principal: NamedDependency[Principal],
        db_session: NamedDependency[AsyncSession],
    ) -> Response[bytes]:
        """Tokens and requests per bucket (`1m`, `1h`, `1d`), optionally grouped."""
        query = build_org_query(
            _params(request), now=utcnow(), limits=USAGE_LIMITS, groups=USAGE_GROUPS
        )
        return _page(await read_page(db_session, principal, query, "usage"), "usage")

    @get("/costs")
    async def costs(
        self,
        request: Request[Any, Any, Any],
        principal: NamedDependency[Principal],
        db_session: NamedDependency[AsyncSession],
    ) -> Response[bytes]:
        """Charged amounts per day, optionally by project (tenant) and line item (model)."""
        query = build_org_query(
            _params(request), now=utcnow(), limits=COSTS_LIMITS, groups=COSTS_GROUPS
        )
        return _page(await read_page(db_session, principal, query, "costs"), "costs")
