"""The report period and filters: one parser for the API and the CLI."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hydrant.platform.errors import InvalidRequest
from hydrant.platform.reports.query import build_query, parse_moment

NOW = datetime(2026, 3, 10, 15, 30, tzinfo=UTC)


def test_default_is_the_last_seven_days_by_day() -> None:
    query = build_query(now=NOW)
    assert (query.since, query.until, query.group_by) == (NOW - timedelta(days=7), NOW, "day")
    assert query.tenant_id is None and query.model is None


def test_dates_cover_whole_days_and_until_date_is_inclusive() -> None:
    query = build_query(now=NOW, since="2026-01-01", until="2026-01-31")
    assert query.since == datetime(2026, 1, 1, tzinfo=UTC)
    assert query.until == datetime(2026, 2, 1, tzinfo=UTC)


def test_datetimes_are_utc_and_until_stays_exclusive() -> None:
    assert parse_moment("2026-01-01T12:00:00", param="since") == datetime(
        2026, 1, 1, 12, tzinfo=UTC
    )
    assert parse_moment("2026-01-01T12:00:00+02:00", param="until", end_of_day=True) == datetime(
        2026, 1, 1, 10, tzinfo=UTC
    )
    assert parse_moment("2026-01-01T12:00:00Z", param="since").tzinfo is UTC


def test_since_alone_runs_until_now_and_until_alone_looks_back_seven_days() -> None:
    assert build_query(now=NOW, since="2026-03-09").until == NOW
    query = build_query(now=NOW, until="2026-03-05")
    assert query.since == datetime(2026, 2, 27, tzinfo=UTC)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"since": "yesterday"}, "since"),
        ({"until": "2026-02-30"}, "until"),
        ({"since": "2026-03-05", "until": "2026-03-04"}, "since"),
        ({"since": "2026-03-05T00:00:00Z", "until": "2026-03-05T00:00:00Z"}, "since"),
        ({"group_by": "week"}, "group_by"),
        ({"since": "2026-01-01", "until": "2026-03-10", "group_by": "hour"}, "since"),
        ({"since": "2020-01-01", "until": "2026-01-01"}, "since"),
        ({"model": "m" * 201}, "model"),
    ],
)
def test_malformed_queries_are_400_naming_the_parameter(kwargs: dict[str, str], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        build_query(now=NOW, **kwargs)
    assert caught.value.param == param
    assert caught.value.status == 400


def test_blank_filters_mean_no_filter() -> None:
    query = build_query(now=NOW, tenant_id="  ", model="")
    assert query.tenant_id is None and query.model is None
    assert build_query(now=NOW, model=" llama ").model == "llama"


def test_by_names_an_attribution_or_one_tag() -> None:
    for by in ("key", "project", "user", "tag:team", "tag:cost-center.v2"):
        assert build_query(now=NOW, by=by).by == by
    assert build_query(now=NOW, by="tag:team").tag == "team"
    assert build_query(now=NOW, by=" ").by is None
    for bad in ("tenant", "tag:", "tag:two words", "tag:x'--", "tag:" + "k" * 65):
        with pytest.raises(InvalidRequest) as info:
            build_query(now=NOW, by=bad)
        assert info.value.param == "by"
