"""Bodies of the credits API: admin grants (`/admin/tenants/{id}/credits`) and the
tenant's `/account/balance`. Money is a decimal string, never a JSON float."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, Literal

from msgspec import Meta, Struct

from hydrant.platform.credits.repository import GrantRow
from hydrant.platform.credits.service import Balance
from hydrant.platform.db.credit_models import CreditAlertThreshold
from hydrant.platform.prices.decimal_text import DecimalText, format_decimal, parse_decimal

Currency = Annotated[str, Meta(pattern=r"^[A-Za-z]{3}$")]
Note = Annotated[str, Meta(max_length=200)]


class GrantCreate(Struct, kw_only=True, forbid_unknown_fields=True):
    kind: Literal["paid", "promo"]
    amount: DecimalText
    currency: Currency = "USD"
    expires_at: datetime | None = None
    note: Note = ""

    def amount_value(self) -> Decimal:
        """The amount as the grant's `Decimal`: positive, at most 6 places (the API's and the
        web form's one check)."""
        return parse_decimal(
            self.amount, param="amount", places=6, integer_digits=10, positive=True
        )


class GrantView(Struct, kw_only=True):
    id: str
    object: Literal["credit_grant"] = "credit_grant"
    tenant_id: str
    kind: str
    amount: str
    used: str
    remaining: str  # what it can still pay: 0 once voided or expired
    currency: str
    note: str
    created_at: datetime
    expires_at: datetime | None
    voided_at: datetime | None

    @classmethod
    def of(cls, row: GrantRow, remaining: Decimal) -> GrantView:
        grant = row.grant
        return cls(
            id=grant.id,
            tenant_id=grant.tenant_id,
            kind=grant.kind,
            amount=format_decimal(grant.amount),
            used=format_decimal(row.used),
            remaining=format_decimal(remaining),
            currency=grant.currency,
            note=grant.note,
            created_at=grant.created_at,
            expires_at=grant.expires_at,
            voided_at=grant.voided_at,
        )


class BalanceView(Struct, kw_only=True):
    object: Literal["credit_balance"] = "credit_balance"
    tenant_id: str
    currency: str
    available: str
    grants: list[GrantView]

    @classmethod
    def of(cls, balance: Balance) -> BalanceView:
        return cls(
            tenant_id=balance.tenant_id,
            currency=balance.currency,
            available=format_decimal(balance.available),
            grants=[GrantView.of(row, left) for row, left in balance.grants],
        )


class AlertThresholdsUpdate(Struct, kw_only=True, forbid_unknown_fields=True):
    """Low-balance thresholds as absolute amounts (decimal strings) in the credits'
    currency; each is mailed once each time the balance falls under it."""

    thresholds: Annotated[list[DecimalText], Meta(max_length=10)]


class AlertThresholdView(Struct, kw_only=True):
    amount: str
    below: bool  # the balance is under it now (mailed; re-armed once back above)
    crossings: int  # how many times the balance fell under it (one mail each)


class AlertThresholdsView(Struct, kw_only=True):
    object: Literal["credit_alert_thresholds"] = "credit_alert_thresholds"
    tenant_id: str
    currency: str
    thresholds: list[AlertThresholdView]

    @classmethod
    def of(
        cls, tenant_id: str, currency: str, rows: list[CreditAlertThreshold]
    ) -> AlertThresholdsView:
        return cls(
            tenant_id=tenant_id,
            currency=currency,
            thresholds=[
                AlertThresholdView(
                    amount=format_decimal(r.amount), below=r.below, crossings=r.crossings
                )
                for r in rows
            ],
        )
