"""What a report asks for: a half-open UTC period, a bucket size and optional filters.

One parser for the HTTP query string and the `hydrant report` command, so
`--since 2026-01-01` and `?since=2026-01-01` always mean the same period.
The period is `[since, until)`. A plain date means the midnight (UTC) that
starts it, except as `until`, where a date means "through that day" (its
end): `since=2026-01-01&until=2026-01-31` is all of January, which is what a
person typing two dates means. Datetimes are taken as given (UTC when they
carry no offset) and `until` stays exclusive.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Literal

from hydrant.platform.errors import InvalidRequest
from hydrant.platform.ledger.attribution import MAX_TAG_KEY, TAG_KEY

Bucket = Literal["day", "hour"]
BUCKETS: tuple[Bucket, ...] = ("day", "hour")
DEFAULT_SPAN = timedelta(days=7)
# The largest period per bucket size: bounds the rows one report can return
# (an hourly report of ten years would be ~90,000 buckets per tenant and model).
MAX_SPAN: dict[Bucket, timedelta] = {"day": timedelta(days=3 * 366), "hour": timedelta(days=62)}
MAX_FILTER_LENGTH = 200
# What a report may group by below the tenant (`by`): a key, a project, a hashed end
# user, or the value of one tag (`tag:<key>`).
ATTRIBUTES = ("key", "project", "user")
TAG_PREFIX = "tag:"


@dataclass(frozen=True)
class ReportQuery:
    since: datetime
    until: datetime
    group_by: Bucket = "day"
    tenant_id: str | None = None
    model: str | None = None
    by: str | None = None  # `key`, `project`, `user` or `tag:<key>` (None: no attribution)

    @property
    def tag(self) -> str | None:
        """The tag key a `tag:<key>` report groups by."""
        if self.by is None or not self.by.startswith(TAG_PREFIX):
            return None
        return self.by.removeprefix(TAG_PREFIX)


def parse_moment(text: str, *, param: str, end_of_day: bool = False) -> datetime:
    """An aware UTC datetime from an ISO date or datetime; 400 naming `param` otherwise."""
    value = text.strip()
    try:
        if len(value) == 10:
            day = date.fromisoformat(value)
            start = datetime(day.year, day.month, day.day, tzinfo=UTC)
            return start + timedelta(days=1) if end_of_day else start
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidRequest(
            f"{param} must be an ISO date (2026-01-31) or datetime (2026-01-31T12:00:00Z)",
            param=param,
        ) from None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def _filter(value: str | None, param: str) -> str | None:
    if value is None or not value.strip():
        return None
    if len(value) > MAX_FILTER_LENGTH:
        raise InvalidRequest(f"{param} is too long", param=param)
    return value.strip()


def parse_by(value: str | None) -> str | None:
    """The attribution a report groups by, or a 400 naming `by`."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    if value in ATTRIBUTES:
        return value
    if value.startswith(TAG_PREFIX) and TAG_KEY.fullmatch(value.removeprefix(TAG_PREFIX)):
        return value
    raise InvalidRequest(
        f"by must be `key`, `project`, `user` or `tag:<key>` (a tag key of 1-{MAX_TAG_KEY}"
        " letters, digits, `_`, `.` or `-`)",
        param="by",
    )


def build_query(
    *,
    now: datetime,
    since: str | None = None,
    until: str | None = None,
    group_by: str = "day",
    tenant_id: str | None = None,
    model: str | None = None,
    by: str | None = None,
) -> ReportQuery:
    """The report query, defaulting to the 7 days up to `now`; 400 on anything malformed."""
    if group_by not in BUCKETS:
        raise InvalidRequest("group_by must be `day` or `hour`", param="group_by")
    bucket: Bucket = group_by
    end = parse_moment(until, param="until", end_of_day=True) if until else now
    start = parse_moment(since, param="since") if since else end - DEFAULT_SPAN
    if start >= end:
        raise InvalidRequest("since must be earlier than until", param="since")
    if end - start > MAX_SPAN[bucket]:
        raise InvalidRequest(
            f"a report by {bucket} covers at most {MAX_SPAN[bucket].days} days;"
            " narrow the period or group by day",
            param="since",
        )
    return ReportQuery(
        since=start,
        until=end,
        group_by=bucket,
        tenant_id=_filter(tenant_id, "tenant_id"),
        model=_filter(model, "model"),
        by=parse_by(by),
    )
