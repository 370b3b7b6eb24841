"""The price book's rules: deployments are unique by name; prices are versions, never edits.

Why versions and never edits: every ledger entry records the price it was
charged at, and a report must be able to say why a charge was what it was.
So a price change is a new row with a later `effective_from`, and a version
may not start in the past (that would reprice requests already served).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from decimal import Decimal

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.db.base import utcnow
from hydrant.platform.db.models import ModelDeployment, Price
from hydrant.platform.errors import Conflict, InvalidRequest, NotFound
from hydrant.platform.prices import repository
from hydrant.platform.prices.decimal_text import parse_decimal
from hydrant.platform.prices.schemas import DeploymentCreate, PriceCreate

# How far in the past an `effective_from` may lie: clock skew between admin and server.
BACKDATE_TOLERANCE = timedelta(minutes=1)
PRICE_PLACES = 10
PRICE_INTEGER_DIGITS = 10


class PriceService:
    def __init__(self, session: AsyncSession, *, clock: Callable[[], datetime] = utcnow) -> None:
        self._session = session
        self._clock = clock

    async def create_deployment(self, body: DeploymentCreate) -> ModelDeployment:
        if await repository.deployment_named(self._session, body.name) is not None:
            raise Conflict(f"a model named {body.name!r} exists", param="name")
        model = ModelDeployment(
            name=body.name,
            path=body.path,
            quantization=body.quantization,
            kv_cache_dtype=body.kv_cache_dtype,
            max_model_len=body.max_model_len,
            created_at=self._clock(),
        )
        self._session.add(model)
        await self._flush("a model with this name exists")
        return model

    async def get_deployment(self, model_id: str) -> ModelDeployment:
        model = await repository.get_deployment(self._session, model_id)
        if model is None:
            raise NotFound(f"no model {model_id!r}", param="model_id")
        return model

    async def list_deployments(
        self, *, limit: int = 50, after: str | None = None
    ) -> tuple[Sequence[ModelDeployment], bool]:
        return await repository.list_deployments(self._session, limit=limit, after=after)

    async def add_price(self, model_id: str, body: PriceCreate) -> Price:
        model = await self.get_deployment(model_id)
        now = self._clock()
        effective_from = body.effective_from or now
        if effective_from < now - BACKDATE_TOLERANCE:
            raise InvalidRequest(
                "effective_from is in the past: a price applies to future requests only",
                param="effective_from",
            )
        input_price = _price(body.input_per_mtok, "input_per_mtok")
        cached = body.cached_input_per_mtok
        price = Price(
            model_id=model.id,
            effective_from=effective_from,
            currency=body.currency,
            input_per_mtok=input_price,
            cached_input_per_mtok=(
                input_price if cached is None else _price(cached, "cached_input_per_mtok")
            ),
            output_per_mtok=_price(body.output_per_mtok, "output_per_mtok"),
            batch_input_per_mtok=_optional_price(body.batch_input_per_mtok, "batch_input_per_mtok"),
            batch_cached_input_per_mtok=_optional_price(
                body.batch_cached_input_per_mtok, "batch_cached_input_per_mtok"
            ),
            batch_output_per_mtok=_optional_price(
                body.batch_output_per_mtok, "batch_output_per_mtok"
            ),
            created_at=now,
        )
        if await repository.price_starting_at(self._session, model.id, effective_from):
            raise Conflict("a price for this model starts at that moment", param="effective_from")
        self._session.add(price)
        await self._flush("a price for this model starts at that moment")
        return price

    async def prices(self, model_id: str) -> Sequence[Price]:
        model = await self.get_deployment(model_id)
        return await repository.prices_of(self._session, model.id)

    async def price_in_force(self, model_id: str, moment: datetime) -> Price | None:
        return await repository.price_in_force(self._session, model_id, moment)

    async def _flush(self, conflict: str) -> None:
        try:
            await self._session.flush()
        except IntegrityError:
            raise Conflict(conflict) from None


def _optional_price(value: str | int | None, param: str) -> Decimal | None:
    """A batch price as set, or None: half the interactive price (the default)."""
    return None if value is None else _price(value, param)


def _price(value: str | int, param: str) -> Decimal:
    return parse_decimal(
        value, param=param, places=PRICE_PLACES, integer_digits=PRICE_INTEGER_DIGITS
    )
