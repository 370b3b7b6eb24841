"""Enqueue a job only once the transaction that caused it has committed.

Why: a job sent from inside a transaction can run before the commit (and not
see its rows) or after a rollback (and mail about something that never
happened). Jobs queued on a session wait in `session.info` and are sent by
the session's `after_commit` event; the end of a transaction that did not commit
(a rollback) drops them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session, SessionTransaction

log = logging.getLogger(__name__)

# (job name, keyword arguments) -> None; must not block for long (it runs at commit).
Enqueue = Callable[[str, dict[str, Any]], None]

_PENDING = "hydrant_jobs_after_commit"


def _send_pending(session: Session) -> None:
    pending: list[tuple[Enqueue, str, dict[str, Any]]] = session.info.pop(_PENDING, [])
    for enqueue, name, kwargs in pending:
        try:
            enqueue(name, kwargs)
        except Exception as exc:  # committed already: log; the periodic sweep re-sends
            log.error("could not enqueue job %s: %s", name, type(exc).__name__)


def _drop_pending(session: Session, transaction: SessionTransaction) -> None:
    # Every transaction's end comes here, savepoints included; only the end of the
    # outermost one drops what is still queued (after a commit nothing is: the
    # `after_commit` hook, which runs first, has sent it all). A savepoint rolled back
    # inside a transaction that then commits keeps its jobs.
    if transaction.parent is None:
        session.info.pop(_PENDING, None)


def enqueue_after_commit(session: AsyncSession, enqueue: Enqueue, name: str, **kwargs: Any) -> None:
    """Send job `name` with `kwargs` after `session`'s next commit; never if it rolls back."""
    sync = session.sync_session
    if not event.contains(sync, "after_commit", _send_pending):
        event.listen(sync, "after_commit", _send_pending)
        event.listen(sync, "after_transaction_end", _drop_pending)
    sync.info.setdefault(_PENDING, []).append((enqueue, name, dict(kwargs)))
