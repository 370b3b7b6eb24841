"""projects, keys' projects, ledger attribution (project, hashed end user, tags)

Revision ID: 0016
Revises: 0017
Create Date: 2026-12-05 08:20:00

Attribution below the tenant (issue #26): a `projects` table, `api_keys.project_id`
(NULL for every existing key: a tenant-level key) and three nullable ledger columns.
`ledger_entries.project_id` has no foreign key (the entry keeps what was true when it
ran), so on SQLite every change here is a native ADD COLUMN: neither `api_keys` nor the
ledger is rebuilt.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import hydrant.platform.db.base

revision: str = "0016"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "projects",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("requests_per_minute", sa.Integer(), nullable=True),
        sa.Column("tokens_per_minute", sa.BigInteger(), nullable=True),
        sa.Column("tokens_per_day", sa.BigInteger(), nullable=True),
        sa.Column("tokens_per_month", sa.BigInteger(), nullable=True),
        sa.Column("spend_per_day", sa.Numeric(precision=20, scale=6), nullable=True),
        sa.Column("spend_per_month", sa.Numeric(precision=20, scale=6), nullable=True),
        sa.Column(
            "created_at", hydrant.platform.db.base.UTCDateTime(timezone=True), nullable=False
        ),
        sa.Column(
            "archived_at", hydrant.platform.db.base.UTCDateTime(timezone=True), nullable=True
        ),
        sa.CheckConstraint(
            "(tokens_per_day IS NULL OR tokens_per_day >= 0)"
            " AND (tokens_per_month IS NULL OR tokens_per_month >= 0)"
            " AND (spend_per_day IS NULL OR spend_per_day >= 0)"
            " AND (spend_per_month IS NULL OR spend_per_month >= 0)",
            name=op.f("ck_projects_budgets"),
        ),
        sa.CheckConstraint(
            "(requests_per_minute IS NULL OR requests_per_minute >= 0)"
            " AND (tokens_per_minute IS NULL OR tokens_per_minute >= 0)",
            name=op.f("ck_projects_limits"),
        ),
        sa.CheckConstraint("status IN ('active', 'archived')", name=op.f("ck_projects_status")),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_projects_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_projects")),
        sa.UniqueConstraint("tenant_id", "name", name=op.f("uq_projects_tenant_id_name")),
    )
    with op.batch_alter_table("projects", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_projects_tenant_id"), ["tenant_id"], unique=False)

    project_fk = sa.ForeignKey("projects.id", name=op.f("fk_api_keys_project_id_projects"))
    if op.get_bind().dialect.name == "sqlite":
        op.add_column(
            "api_keys",
            sa.Column("project_id", sa.String(length=40), project_fk, nullable=True),
            inline_references=True,
        )
        op.create_index(op.f("ix_api_keys_project_id"), "api_keys", ["project_id"], unique=False)
    else:
        with op.batch_alter_table("api_keys", schema=None) as batch_op:
            batch_op.add_column(sa.Column("project_id", sa.String(length=40), nullable=True))
            batch_op.create_index(batch_op.f("ix_api_keys_project_id"), ["project_id"])
            batch_op.create_foreign_key(
                batch_op.f("fk_api_keys_project_id_projects"), "projects", ["project_id"], ["id"]
            )

    # A key's own budgets: native ADD COLUMNs (no CHECK, which would rebuild the table).
    op.add_column("api_keys", sa.Column("tokens_per_day", sa.BigInteger(), nullable=True))
    op.add_column("api_keys", sa.Column("tokens_per_month", sa.BigInteger(), nullable=True))
    op.add_column(
        "api_keys", sa.Column("spend_per_day", sa.Numeric(precision=20, scale=6), nullable=True)
    )
    op.add_column(
        "api_keys", sa.Column("spend_per_month", sa.Numeric(precision=20, scale=6), nullable=True)
    )
    op.add_column("ledger_entries", sa.Column("project_id", sa.String(length=40), nullable=True))
    op.add_column("ledger_entries", sa.Column("end_user", sa.String(length=64), nullable=True))
    op.add_column("ledger_entries", sa.Column("tags", sa.JSON(), nullable=True))
    op.create_index(
        op.f("ix_ledger_entries_project_id_finished_at"),
        "ledger_entries",
        ["project_id", "finished_at"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_ledger_entries_project_id_finished_at"), table_name="ledger_entries")
    op.drop_column("ledger_entries", "tags")
    op.drop_column("ledger_entries", "end_user")
    op.drop_column("ledger_entries", "project_id")
    for column in ("spend_per_month", "spend_per_day", "tokens_per_month", "tokens_per_day"):
        op.drop_column("api_keys", column)
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        # SQLite cannot drop a column with a REFERENCES clause, so `api_keys` is rebuilt;
        # the rebuild's DROP TABLE would set every ledger entry's key to NULL unless
        # foreign keys are off, which only works outside a transaction (as in 0002).
        bind.exec_driver_sql("PRAGMA foreign_keys=OFF")
        enforced = bind.exec_driver_sql("PRAGMA foreign_keys").scalar()
        if enforced and bind.execute(sa.text("SELECT 1 FROM api_keys LIMIT 1")).first():
            raise RuntimeError(
                "cannot downgrade below 0016 on SQLite inside a transaction while keys exist:"
                " rebuilding api_keys would detach every ledger entry from its key"
            )
        op.drop_index(op.f("ix_api_keys_project_id"), table_name="api_keys")
        with op.batch_alter_table("api_keys", schema=None, recreate="always") as batch_op:
            batch_op.drop_column("project_id")
    else:
        with op.batch_alter_table("api_keys", schema=None) as batch_op:
            batch_op.drop_constraint(
                batch_op.f("fk_api_keys_project_id_projects"), type_="foreignkey"
            )
            batch_op.drop_index(batch_op.f("ix_api_keys_project_id"))
            batch_op.drop_column("project_id")
    with op.batch_alter_table("projects", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_projects_tenant_id"))
    op.drop_table("projects")
