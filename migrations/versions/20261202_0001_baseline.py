"""baseline tenants keys models prices ledger

Revision ID: 0001
Revises:
Create Date: 2026-12-02 13:29:49.109087
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import hydrant.platform.db.base

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("path", sa.String(length=1000), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("quantization", sa.String(length=16), nullable=True),
        sa.Column("kv_cache_dtype", sa.String(length=16), nullable=True),
        sa.Column("max_model_len", sa.Integer(), nullable=True),
        sa.Column(
            "created_at", hydrant.platform.db.base.UTCDateTime(timezone=True), nullable=False
        ),
        sa.CheckConstraint("status IN ('active', 'retired')", name=op.f("ck_models_status")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_models")),
        sa.UniqueConstraint("name", name=op.f("uq_models_name")),
    )
    op.create_table(
        "tenants",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("contact_email", sa.String(length=320), nullable=True),
        sa.Column("timezone", sa.String(length=64), nullable=False),
        sa.Column(
            "created_at", hydrant.platform.db.base.UTCDateTime(timezone=True), nullable=False
        ),
        sa.Column(
            "updated_at", hydrant.platform.db.base.UTCDateTime(timezone=True), nullable=False
        ),
        sa.CheckConstraint("status IN ('active', 'suspended')", name=op.f("ck_tenants_status")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
        sa.UniqueConstraint("name", name=op.f("uq_tenants_name")),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=True),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("prefix", sa.String(length=32), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("scopes", sa.String(length=200), nullable=False),
        sa.Column(
            "created_at", hydrant.platform.db.base.UTCDateTime(timezone=True), nullable=False
        ),
        sa.Column("expires_at", hydrant.platform.db.base.UTCDateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", hydrant.platform.db.base.UTCDateTime(timezone=True), nullable=True),
        sa.Column(
            "last_used_at", hydrant.platform.db.base.UTCDateTime(timezone=True), nullable=True
        ),
        sa.Column("rotated_from_id", sa.String(length=40), nullable=True),
        sa.ForeignKeyConstraint(
            ["rotated_from_id"],
            ["api_keys.id"],
            name=op.f("fk_api_keys_rotated_from_id_api_keys"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_api_keys_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("prefix", name=op.f("uq_api_keys_prefix")),
    )
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_api_keys_tenant_id"), ["tenant_id"], unique=False)

    op.create_table(
        "prices",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("model_id", sa.String(length=40), nullable=False),
        sa.Column(
            "effective_from", hydrant.platform.db.base.UTCDateTime(timezone=True), nullable=False
        ),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("input_per_mtok", sa.Numeric(precision=20, scale=10), nullable=False),
        sa.Column("cached_input_per_mtok", sa.Numeric(precision=20, scale=10), nullable=False),
        sa.Column("output_per_mtok", sa.Numeric(precision=20, scale=10), nullable=False),
        sa.Column(
            "created_at", hydrant.platform.db.base.UTCDateTime(timezone=True), nullable=False
        ),
        sa.CheckConstraint(
            "input_per_mtok >= 0 AND cached_input_per_mtok >= 0 AND output_per_mtok >= 0",
            name=op.f("ck_prices_non_negative"),
        ),
        sa.ForeignKeyConstraint(
            ["model_id"], ["models.id"], name=op.f("fk_prices_model_id_models"), ondelete="RESTRICT"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_prices")),
        sa.UniqueConstraint(
            "model_id", "effective_from", name=op.f("uq_prices_model_id_effective_from")
        ),
    )
    op.create_table(
        "ledger_entries",
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("api_key_id", sa.String(length=40), nullable=True),
        sa.Column("model_id", sa.String(length=40), nullable=False),
        sa.Column("price_id", sa.String(length=40), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("input_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("charged", sa.Numeric(precision=20, scale=6), nullable=False),
        sa.Column("device_seconds", sa.Numeric(precision=20, scale=9), nullable=False),
        sa.Column("device_cost", sa.Numeric(precision=20, scale=6), nullable=False),
        sa.Column(
            "started_at", hydrant.platform.db.base.UTCDateTime(timezone=True), nullable=False
        ),
        sa.Column(
            "finished_at", hydrant.platform.db.base.UTCDateTime(timezone=True), nullable=False
        ),
        sa.Column(
            "recorded_at", hydrant.platform.db.base.UTCDateTime(timezone=True), nullable=False
        ),
        sa.CheckConstraint(
            "status IN ('finished', 'stopped', 'aborted', 'failed')",
            name=op.f("ck_ledger_entries_status"),
        ),
        sa.CheckConstraint(
            "input_tokens >= 0 AND cached_tokens >= 0 AND output_tokens >= 0",
            name=op.f("ck_ledger_entries_non_negative_tokens"),
        ),
        sa.ForeignKeyConstraint(
            ["api_key_id"],
            ["api_keys.id"],
            name=op.f("fk_ledger_entries_api_key_id_api_keys"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["models.id"],
            name=op.f("fk_ledger_entries_model_id_models"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["price_id"],
            ["prices.id"],
            name=op.f("fk_ledger_entries_price_id_prices"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_ledger_entries_tenant_id_tenants"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("request_id", name=op.f("pk_ledger_entries")),
    )
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_ledger_entries_model_id_finished_at"),
            ["model_id", "finished_at"],
            unique=False,
        )
        batch_op.create_index(
            batch_op.f("ix_ledger_entries_tenant_id_finished_at"),
            ["tenant_id", "finished_at"],
            unique=False,
        )


def downgrade() -> None:
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ledger_entries_tenant_id_finished_at"))
        batch_op.drop_index(batch_op.f("ix_ledger_entries_model_id_finished_at"))

    op.drop_table("ledger_entries")
    op.drop_table("prices")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_keys_tenant_id"))

    op.drop_table("api_keys")
    op.drop_table("tenants")
    op.drop_table("models")
