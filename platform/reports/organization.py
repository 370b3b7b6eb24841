"""OpenAI's organization usage and costs API over the ledger: the query, its buckets, pages.

`GET /v1/organization/usage/completions` and `GET /v1/organization/costs` read the
ledger with the reports' own bucketing and exact sums (repository.py), so their
numbers are the cost report's. Buckets lie on the UTC grid of their width (a `1d`
bucket is a UTC day): the first is the one holding `start_time`, and entries count
from `start_time` to `end_time` (exclusive), so a bucket cut by either edge holds
only the part inside. A page is `limit` consecutive buckets (empty ones too, with no
results, as OpenAI returns them); `next_page` names the first bucket of the next
page, so walking the pages visits every bucket once. OpenAI's `project_id` is the
entry's Hydrant project, or its tenant for a tenant-level key (the tenant stands for
OpenAI's "Default project"); `user_id` is the hashed end user (`user` or
`safety_identifier` of the request, ledger/attribution.py); `line_item` of the costs is the
model (a request is charged one rounded amount, which is not split into input and
output without rounding again).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal

from sqlalchemy import ColumnElement, func, literal_column, select
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.principal import Principal
from hydrant.platform.auth.scoping import scope_to
from hydrant.platform.billing.money import STORAGE_PLACES
from hydrant.platform.db.models import LedgerEntry, ModelDeployment, Price
from hydrant.platform.errors import InvalidRequest
from hydrant.platform.reports.repository import (
    Truncation,
    bucket_of,
    bucket_value,
    exact_sum,
    exact_value,
    reported_model,
)

Width = Literal["1m", "1h", "1d"]
WIDTHS: dict[str, tuple[Truncation, int]] = {
    "1m": ("minute", 60),
    "1h": ("hour", 3600),
    "1d": ("day", 86400),
}
# OpenAI's limits on buckets per page: (default, most) per width.
USAGE_LIMITS: dict[str, tuple[int, int]] = {"1d": (7, 31), "1h": (24, 168), "1m": (60, 1440)}
COSTS_LIMITS: dict[str, tuple[int, int]] = {"1d": (7, 180)}
USAGE_GROUPS = ("model", "api_key_id", "project_id", "user_id", "batch")
COSTS_GROUPS = ("project_id", "line_item")
MAX_FILTER_VALUES = 100
PAGE_PREFIX = "page_"


@dataclass(frozen=True)
class OrgQuery:
    start: int  # unix seconds, inclusive
    end: int  # unix seconds, exclusive
    width: str
    limit: int
    page_start: int  # the first bucket of this page (on the grid)
    group_by: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    api_key_ids: tuple[str, ...] = ()
    project_ids: tuple[str, ...] = ()
    user_ids: tuple[str, ...] = ()

    @property
    def step(self) -> int:
        return WIDTHS[self.width][1]

    def bucket_starts(self) -> tuple[list[int], int | None]:
        """This page's bucket starts, and the next page's first (None: this is the last)."""
        starts: list[int] = []
        moment = self.page_start
        while moment < self.end and len(starts) < self.limit:
            starts.append(moment)
            moment += self.step
        return starts, (moment if moment < self.end else None)


def _int(value: str | None, param: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise InvalidRequest(f"{param} must be an integer", param=param) from None


def _values(values: Sequence[str], param: str) -> tuple[str, ...]:
    flat = tuple(v for value in values for v in value.split(",") if v)
    if len(flat) > MAX_FILTER_VALUES or any(len(v) > 200 for v in flat):
        raise InvalidRequest(f"{param} has too many or too long values", param=param)
    return flat


def encode_page(start: int) -> str:
    return PAGE_PREFIX + base64.urlsafe_b64encode(str(start).encode()).decode().rstrip("=")


def decode_page(token: str) -> int:
    try:
        raw = token.removeprefix(PAGE_PREFIX)
        return int(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode())
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidRequest("page is not a cursor this API returned", param="page") from None


def build_org_query(
    params: dict[str, list[str]],
    *,
    now: datetime,
    limits: dict[str, tuple[int, int]],
    groups: tuple[str, ...],
) -> OrgQuery:
    """The query from the query string (arrays as `k=a&k=b`, `k[]=a` or `k=a,b`); a 400
    in OpenAI's shape naming the parameter for anything malformed."""

    def one(name: str) -> str | None:
        found = params.get(name) or []
        return found[-1] if found else None

    def many(name: str) -> list[str]:
        return [*params.get(name, []), *params.get(f"{name}[]", [])]

    start = _int(one("start_time"), "start_time")
    if start is None:
        raise InvalidRequest("start_time is required (unix seconds)", param="start_time")
    end = _int(one("end_time"), "end_time")
    if end is None:
        end = int(now.timestamp())
    if start < 0 or end <= start:
        raise InvalidRequest("end_time must be later than start_time", param="end_time")
    width = one("bucket_width") or "1d"
    if width not in limits:
        allowed = ", ".join(f"`{w}`" for w in limits)
        raise InvalidRequest(f"bucket_width must be one of {allowed}", param="bucket_width")
    default, most = limits[width]
    limit = _int(one("limit"), "limit")
    limit = default if limit is None else limit
    if not 1 <= limit <= most:
        raise InvalidRequest(
            f"limit must be between 1 and {most} for bucket_width {width}", param="limit"
        )
    step = WIDTHS[width][1]
    first = start - start % step
    page = one("page")
    page_start = first if not page else decode_page(page)
    if page_start < first or page_start >= end or (page_start - first) % step:
        raise InvalidRequest("page does not belong to this time range", param="page")
    group_by = _values(many("group_by"), "group_by")
    for name in group_by:
        if name not in groups:
            raise InvalidRequest(
                f"group_by must be among {', '.join(groups)}; got {name!r}", param="group_by"
            )
    return OrgQuery(
        start=start,
        end=end,
        width=width,
        limit=limit,
        page_start=page_start,
        group_by=tuple(dict.fromkeys(group_by)),
        models=_values(many("models"), "models"),
        api_key_ids=_values(many("api_key_ids"), "api_key_ids"),
        project_ids=_values(many("project_ids"), "project_ids"),
        user_ids=_values(many("user_ids"), "user_ids"),
    )


@dataclass
class UsageResult:
    input_tokens: int = 0
    output_tokens: int = 0
    input_cached_tokens: int = 0
    num_model_requests: int = 0
    model: str | None = None
    api_key_id: str | None = None
    project_id: str | None = None
    user_id: str | None = None
    batch: bool | None = None


@dataclass
class CostResult:
    amount: Decimal
    currency: str
    project_id: str | None = None
    line_item: str | None = None


@dataclass
class OrgBucket:
    start: int
    end: int
    usage: list[UsageResult] = field(default_factory=list)
    costs: list[CostResult] = field(default_factory=list)


@dataclass(frozen=True)
class OrgPage:
    buckets: list[OrgBucket]
    next_page: str | None


def _moment(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _dialect(session: AsyncSession) -> str:
    return session.bind.dialect.name if session.bind is not None else "sqlite"


def _project() -> ColumnElement[Any]:
    """OpenAI's project of an entry: its Hydrant project, else its tenant's own."""
    return func.coalesce(LedgerEntry.project_id, LedgerEntry.tenant_id)


def _group_columns(query: OrgQuery) -> dict[str, ColumnElement[Any]]:
    columns: dict[str, ColumnElement[Any]] = {
        "model": reported_model(),
        "line_item": reported_model(),
        "api_key_id": LedgerEntry.api_key_id.expression,
        "project_id": _project(),
        "user_id": LedgerEntry.end_user.expression,
        "batch": LedgerEntry.batch_id.is_not(None),
    }
    return {name: columns[name] for name in query.group_by}


async def read_page(
    session: AsyncSession, principal: Principal, query: OrgQuery, kind: Literal["usage", "costs"]
) -> OrgPage:
    """One page of buckets with their results, summed exactly in SQL."""
    starts, following = query.bucket_starts()
    buckets = {s: OrgBucket(s, s + query.step) for s in starts}
    since = max(query.start, starts[0])
    until = min(query.end, starts[-1] + query.step)
    dialect = _dialect(session)
    truncation = WIDTHS[query.width][0]
    bucket = bucket_of(dialect, truncation)
    groups = _group_columns(query)
    currency = func.coalesce(Price.currency, literal_column("'USD'"))
    keys: list[ColumnElement[Any]] = [bucket, *groups.values()]
    if kind == "costs":
        keys.append(currency)
    statement = (
        select(
            *keys,
            func.count(),
            func.coalesce(func.sum(LedgerEntry.input_tokens), 0),
            func.coalesce(func.sum(LedgerEntry.cached_tokens), 0),
            func.coalesce(func.sum(LedgerEntry.output_tokens), 0),
            exact_sum(dialect, LedgerEntry.charged, STORAGE_PLACES),
        )
        .join(ModelDeployment, ModelDeployment.id == LedgerEntry.model_id)
        .outerjoin(Price, Price.id == LedgerEntry.price_id)
        .where(
            LedgerEntry.finished_at >= _moment(since),
            LedgerEntry.finished_at < _moment(until),
        )
    )
    if query.models:
        statement = statement.where(reported_model().in_(query.models))
    if query.api_key_ids:
        statement = statement.where(LedgerEntry.api_key_id.in_(query.api_key_ids))
    if query.project_ids:
        statement = statement.where(_project().in_(query.project_ids))
    if query.user_ids:
        statement = statement.where(LedgerEntry.end_user.in_(query.user_ids))
    statement = scope_to(statement, LedgerEntry, principal)
    statement = statement.group_by(*keys).order_by(*keys)
    for row in (await session.execute(statement)).all():
        start = int(bucket_value(row[0]).timestamp())
        target = buckets.get(start)
        if target is None:  # cannot happen: the WHERE keeps rows inside this page
            continue
        values = dict(zip(groups, row[1 : 1 + len(groups)], strict=True))
        rest = list(row[1 + len(groups) :])
        if kind == "costs":
            currency_code, *rest = rest
            target.costs.append(
                CostResult(
                    amount=exact_value(rest[4], dialect, STORAGE_PLACES),
                    currency=str(currency_code).lower(),
                    project_id=values.get("project_id"),
                    line_item=values.get("line_item"),
                )
            )
            continue
        batch = values.get("batch")
        target.usage.append(
            UsageResult(
                num_model_requests=int(rest[0]),
                input_tokens=int(rest[1]),
                input_cached_tokens=int(rest[2]),
                output_tokens=int(rest[3]),
                model=values.get("model"),
                api_key_id=values.get("api_key_id"),
                project_id=values.get("project_id"),
                user_id=values.get("user_id"),
                batch=None if batch is None else bool(batch),
            )
        )
    return OrgPage(
        buckets=[buckets[s] for s in starts],
        next_page=None if following is None else encode_page(following),
    )
