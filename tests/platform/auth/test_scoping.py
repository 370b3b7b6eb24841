"""`scope_to`, the one tenant filter: admins see all, a tenant its own rows, others nothing."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.dialects import sqlite

from hydrant.platform.auth.principal import Principal
from hydrant.platform.auth.scoping import scope_to
from hydrant.platform.db.models import ApiKey, Price, Tenant

ADMIN = Principal(None, "key_a", "hyd_test_a", frozenset({"admin"}))
TENANT = Principal("ten_1", "key_t", "hyd_test_t", frozenset({"inference"}))
NOBODY = Principal(None, "key_n", "hyd_test_n", frozenset({"inference"}))


def _sql(statement: object) -> str:
    return str(statement.compile(dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True}))  # type: ignore[attr-defined]


def test_admin_queries_are_unchanged() -> None:
    statement = select(ApiKey)
    assert _sql(scope_to(statement, ApiKey, ADMIN)) == _sql(statement)


def test_tenant_queries_are_filtered_on_the_tenant_column() -> None:
    assert "api_keys.tenant_id = 'ten_1'" in _sql(scope_to(select(ApiKey), ApiKey, TENANT))
    assert "tenants.id = 'ten_1'" in _sql(scope_to(select(Tenant), Tenant, TENANT))


def test_a_non_admin_without_tenant_sees_nothing() -> None:
    assert "WHERE 0 = 1" in _sql(scope_to(select(ApiKey), ApiKey, NOBODY))


def test_tables_without_a_tenant_are_refused() -> None:
    with pytest.raises(TypeError, match="not tenant data"):
        scope_to(select(Price), Price, TENANT)
