"""budget alerts for projects' and API keys' own budgets

Revision ID: 0018
Revises: 0016
Create Date: 2026-12-05 10:45:00

Budget alerts (issue #26's leftovers) go out for a project's and a key's own budgets as
they do for the tenant's plan: once per (tenant, owner, budget, period, threshold). Two
columns on `budget_alert_sends`: `scope` (tenant, project or key) and `owner` (the id of
the tenant, project or key whose budget it is; every existing row is the tenant's), and
the once-only unique constraint widened by the owner. On SQLite the table is rebuilt (a
constraint cannot be changed in place); nothing references it.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_UNIQUE = "uq_budget_alert_sends_tenant_id_budget_period_threshold"
NEW_UNIQUE = "uq_budget_alert_sends_tenant_id_owner_budget_period_threshold"


def upgrade() -> None:
    with op.batch_alter_table("budget_alert_sends", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("scope", sa.String(length=16), server_default="tenant", nullable=False)
        )
        batch_op.add_column(sa.Column("owner", sa.String(length=40), nullable=True))
    op.execute("UPDATE budget_alert_sends SET owner = tenant_id")
    with op.batch_alter_table("budget_alert_sends", schema=None) as batch_op:
        batch_op.alter_column("owner", existing_type=sa.String(length=40), nullable=False)
        batch_op.drop_constraint(batch_op.f(OLD_UNIQUE), type_="unique")
        batch_op.create_unique_constraint(
            batch_op.f(NEW_UNIQUE), ["tenant_id", "owner", "budget", "period", "threshold"]
        )
        batch_op.create_check_constraint(
            batch_op.f("ck_budget_alert_sends_scope"), "scope IN ('tenant', 'project', 'key')"
        )


def downgrade() -> None:
    # A project's or key's alerts have no place in the old shape (they would collide with
    # the tenant's under the old constraint): they are dropped; the tenant's stay.
    op.execute("DELETE FROM budget_alert_sends WHERE scope <> 'tenant'")
    with op.batch_alter_table("budget_alert_sends", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("ck_budget_alert_sends_scope"), type_="check")
        batch_op.drop_constraint(batch_op.f(NEW_UNIQUE), type_="unique")
        batch_op.create_unique_constraint(
            batch_op.f(OLD_UNIQUE), ["tenant_id", "budget", "period", "threshold"]
        )
        batch_op.drop_column("owner")
        batch_op.drop_column("scope")
