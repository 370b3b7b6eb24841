"""Bodies of the price book API. Prices are decimal strings in JSON, Decimal inside."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from msgspec import Meta, Struct

from hydrant.platform.db.models import ModelDeployment, Price
from hydrant.platform.ledger.repository import PriceVersion
from hydrant.platform.prices.decimal_text import DecimalText, format_decimal

AwareDateTime = Annotated[datetime, Meta(tz=True)]
Quantization = Literal["int8", "int4"]
KvCacheDtype = Literal["int8"]


class DeploymentCreate(Struct, kw_only=True, forbid_unknown_fields=True):
    name: Annotated[str, Meta(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][\w.:/-]*$")]
    path: Annotated[str, Meta(min_length=1, max_length=1000)]
    quantization: Quantization | None = None
    kv_cache_dtype: KvCacheDtype | None = None
    max_model_len: Annotated[int, Meta(ge=1, le=2**31 - 1)] | None = None


class DeploymentView(Struct, kw_only=True):
    id: str
    object: Literal["model_deployment"] = "model_deployment"
    name: str
    path: str
    status: str
    quantization: str | None
    kv_cache_dtype: str | None
    max_model_len: int | None
    created_at: datetime

    @classmethod
    def of(cls, model: ModelDeployment) -> DeploymentView:
        return cls(
            id=model.id,
            name=model.name,
            path=model.path,
            status=model.status,
            quantization=model.quantization,
            kv_cache_dtype=model.kv_cache_dtype,
            max_model_len=model.max_model_len,
            created_at=model.created_at,
        )


class DeploymentList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[DeploymentView]
    has_more: bool


class PriceCreate(Struct, kw_only=True, forbid_unknown_fields=True):
    """Per million tokens. `cached_input_per_mtok` defaults to the input price; each
    `batch_*` price (a Batch API line's) to half its interactive price."""

    input_per_mtok: DecimalText
    output_per_mtok: DecimalText
    cached_input_per_mtok: DecimalText | None = None
    batch_input_per_mtok: DecimalText | None = None
    batch_cached_input_per_mtok: DecimalText | None = None
    batch_output_per_mtok: DecimalText | None = None
    currency: Annotated[str, Meta(pattern=r"^[A-Z]{3}$")] = "USD"
    effective_from: AwareDateTime | None = None  # now when omitted


class PriceView(Struct, kw_only=True):
    id: str
    object: Literal["price"] = "price"
    model_id: str
    effective_from: datetime
    currency: str
    input_per_mtok: str
    cached_input_per_mtok: str
    output_per_mtok: str
    # What a Batch API line is charged under this version (half the interactive price
    # unless it was set).
    batch_input_per_mtok: str
    batch_cached_input_per_mtok: str
    batch_output_per_mtok: str
    created_at: datetime

    @classmethod
    def of(cls, price: Price) -> PriceView:
        batch = PriceVersion.of(price).price(batch=True)
        return cls(
            id=price.id,
            model_id=price.model_id,
            effective_from=price.effective_from,
            currency=price.currency,
            input_per_mtok=format_decimal(price.input_per_mtok),
            cached_input_per_mtok=format_decimal(price.cached_input_per_mtok),
            output_per_mtok=format_decimal(price.output_per_mtok),
            batch_input_per_mtok=format_decimal(batch.input_per_million),
            batch_cached_input_per_mtok=format_decimal(batch.cached_rate),
            batch_output_per_mtok=format_decimal(batch.output_per_million),
            created_at=price.created_at,
        )


class PriceList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[PriceView]
