"""Bodies of the adapter admin API (`/admin/models/{base}/adapters`)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from msgspec import Meta, Struct

from hydrant.platform.db.adapter_models import Adapter
from hydrant.platform.prices.decimal_text import DecimalText, format_decimal
from hydrant.platform.prices.schemas import PriceCreate

AdapterName = Annotated[
    str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]


class AdapterCreate(Struct, kw_only=True, forbid_unknown_fields=True):
    """`tenant_id` null: a public adapter. `price`: its first price version (optional: with
    none of its own, requests are charged the base model's price). `hosting_fee_per_day`:
    charged to its tenant for every UTC day it is registered (a tenant's adapter only)."""

    name: AdapterName
    path: Annotated[str, Meta(min_length=1, max_length=1000)]
    tenant_id: str | None = None
    price: PriceCreate | None = None
    hosting_fee_per_day: DecimalText | None = None  # charged to its tenant per UTC day


class AdapterView(Struct, kw_only=True):
    id: str
    object: Literal["model.adapter"] = "model.adapter"
    base_model: str
    name: str
    model: str  # what requests name: `base:adapter`
    path: str
    tenant_id: str | None
    hosting_fee_per_day: str | None
    # Its entry in the price book (`/admin/models/{price_model_id}/prices`).
    price_model_id: str
    created_at: datetime

    @classmethod
    def of(cls, row: Adapter, price_model_id: str) -> AdapterView:
        return cls(
            id=row.id,
            base_model=row.base_model,
            name=row.name,
            model=f"{row.base_model}:{row.name}",
            path=row.path,
            tenant_id=row.tenant_id,
            hosting_fee_per_day=(
                None if row.hosting_fee_per_day is None else format_decimal(row.hosting_fee_per_day)
            ),
            price_model_id=price_model_id,
            created_at=row.created_at,
        )


class AdapterList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[AdapterView]
