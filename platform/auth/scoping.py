"""THE tenant-scoping helper: every query that touches tenant data goes through `scope_to`.

Why one helper: a tenant reaching another tenant's row is the one bug a
multi-tenant platform cannot have, and a filter written by hand in each query
is one forgotten `where` away from it. Admins see every row; a tenant
principal sees only rows of its own tenant; anything else sees nothing.
Rows outside the scope simply do not match, so services answer 404 for them
and existence is never revealed.
"""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import Select, false
from sqlalchemy.orm import InstrumentedAttribute

from hydrant.platform.auth.principal import Principal
from hydrant.platform.db.models import Tenant

S = TypeVar("S", bound=Select[Any])


def tenant_column(model: type[Any]) -> InstrumentedAttribute[Any]:
    """The column that says which tenant a row of `model` belongs to."""
    if model is Tenant:
        return Tenant.id
    column = getattr(model, "tenant_id", None)
    if not isinstance(column, InstrumentedAttribute):
        raise TypeError(f"{model.__name__} has no tenant column; it is not tenant data")
    return column


def scope_to(statement: S, model: type[Any], principal: Principal) -> S:
    """`statement` restricted to the rows of `model` that `principal` may see."""
    if principal.is_admin:
        tenant_column(model)  # still refuses a model that is not tenant data
        return statement
    return scope_to_tenant(statement, model, principal.tenant_id)


def scope_to_tenant(statement: S, model: type[Any], tenant_id: str | None) -> S:
    """`statement` restricted to one tenant's rows, whoever asks: for data only its tenant
    may read, even with an admin key (its prompts and answers). No tenant: no rows."""
    column = tenant_column(model)
    if tenant_id is None:
        return statement.where(false())
    return statement.where(column == tenant_id)
