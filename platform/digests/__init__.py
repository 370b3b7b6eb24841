"""Daily cost digests by email (tenant and admin), budget alerts, and per-recipient unsubscribe."""
