"""The cost ledger; for now its durable local spool (`spool`), used while the database is down."""

from hydrant.platform.ledger.spool import (
    LedgerSpool,
    ReplayResult,
    SpoolError,
    SpoolFullError,
    SpoolLockedError,
)

__all__ = ["LedgerSpool", "ReplayResult", "SpoolError", "SpoolFullError", "SpoolLockedError"]
