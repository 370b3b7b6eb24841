"""Outgoing mail: SMTP or an outbox folder of `.eml` files, shared by digests and alerts."""
