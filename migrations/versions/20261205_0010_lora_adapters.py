"""lora adapters

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05 07:30:00.000000

LoRA adapters (issue #28): the `adapters` table (unique name per base model, an owning
tenant or NULL for public, an optional hosting fee per day) and the nullable `ledger_entries.adapter`, which SQLite adds
in place (no rebuild; existing entries ran on base models: NULL is right for them).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import hydrant.platform.db.base

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "adapters",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("base_model", sa.String(length=200), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("path", sa.String(length=1000), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=True),
        sa.Column("hosting_fee_per_day", sa.Numeric(precision=20, scale=6), nullable=True),
        sa.Column(
            "created_at", hydrant.platform.db.base.UTCDateTime(timezone=True), nullable=False
        ),
        sa.CheckConstraint(
            "hosting_fee_per_day IS NULL OR hosting_fee_per_day >= 0",
            name=op.f("ck_adapters_hosting_fee"),
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_adapters_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_adapters")),
        sa.UniqueConstraint("base_model", "name", name=op.f("uq_adapters_base_model_name")),
    )
    with op.batch_alter_table("adapters", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_adapters_tenant_id"), ["tenant_id"], unique=False)
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.add_column(sa.Column("adapter", sa.String(length=64), nullable=True))


def downgrade() -> None:
    # Not batch mode: SQLite's batch mode rebuilds the table, and the ledger's foreign keys
    # refuse the rebuild's DROP TABLE (as migration 0007 explains).
    op.drop_column("ledger_entries", "adapter")
    op.drop_index(op.f("ix_adapters_tenant_id"), table_name="adapters")
    op.drop_table("adapters")
