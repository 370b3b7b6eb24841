"""What a receiver is sent: Stripe meter events, or generic JSON (money as decimal strings).

Stripe (`POST /v1/billing/meter_events`, form-encoded, one event per request):
`event_name` (the `usage_export_event_name` setting), `payload[stripe_customer_id]` (the
tenant's billing customer), `payload[value]` = the record's tokens, input plus output
(cached input tokens are part of input), `identifier` = the record's idempotency key,
`timestamp` = the start of its hour (so a correction lands in the same billing period).
One meter of total tokens, because a Stripe meter sums one value per event; a price per
direction needs the per-direction counts, which the `json` format carries. The key is
also sent as the `Idempotency-Key` header, so a re-send after a crash gets Stripe's
original answer rather than a duplicate-identifier refusal.

JSON: `POST {"records": [...]}`, a batch at once; each record carries its own
`identifier`, the receiver's key to count it once, and the tenant's Stripe customer
when it has one (null otherwise: the JSON export does not wait for one).
"""

from __future__ import annotations

from typing import Any

from hydrant.platform.db.models import UsageExportRecord


def stripe_value(record: UsageExportRecord) -> int:
    return record.input_tokens + record.output_tokens


def stripe_form(record: UsageExportRecord, event_name: str, customer: str) -> dict[str, str]:
    return {
        "event_name": event_name,
        "payload[stripe_customer_id]": customer,
        "payload[value]": str(stripe_value(record)),
        "identifier": record.idempotency_key,
        "timestamp": str(int(record.hour.timestamp())),
    }


def json_record(record: UsageExportRecord, customer: str | None) -> dict[str, Any]:
    return {
        "identifier": record.idempotency_key,
        "tenant_id": record.tenant_id,
        "stripe_customer_id": customer,
        "model": record.model,
        "hour": record.hour.isoformat(),
        "sequence": record.sequence,
        "requests": record.requests,
        "input_tokens": record.input_tokens,
        "cached_tokens": record.cached_tokens,
        "output_tokens": record.output_tokens,
        "charged": str(record.charged),
    }
