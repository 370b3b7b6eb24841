"""LoRA adapters (issue #28, migration 0010): fine-tunes served on top of a base model.

An adapter is a tenant's private asset (or public with no tenant): its name is unique per
base model, and requests name it as `base:adapter` or by its name alone. Its price is a
price-book entry of its own under the model name `base:adapter` (a `models` row the
registration makes), so price versions, history and the ledger's `price_id` work as for
any model; with no version of its own, the base model's price applies.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlalchemy import CheckConstraint, ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from hydrant.platform.db.base import MONEY, Base, UTCDateTime, new_id, utcnow


class Adapter(Base):
    __tablename__ = "adapters"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("adp"))
    base_model: Mapped[str] = mapped_column(String(200))
    name: Mapped[str] = mapped_column(String(64))
    path: Mapped[str] = mapped_column(String(1000))
    # NULL: public (every tenant may use it); else only this tenant sees and calls it.
    tenant_id: Mapped[str | None] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), index=True
    )
    # Charged to the owning tenant once per UTC day it is registered (adapters/hosting.py);
    # NULL: none. A public adapter has no tenant to charge, so none (the service refuses it).
    hosting_fee_per_day: Mapped[Decimal | None] = mapped_column(MONEY)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    __table_args__ = (
        UniqueConstraint("base_model", "name"),
        CheckConstraint(
            "hosting_fee_per_day IS NULL OR hosting_fee_per_day >= 0", name="hosting_fee"
        ),
    )
