"""How the digest and budget-alert services are made: one place for the API, the jobs and the CLI.

Why one place: a digest link must be signed with the same secret and point
at the same public URL whether the admin API, a Celery task or `hydrant jobs`
made the service.
"""

from __future__ import annotations

from litestar.di import NamedDependency

from hydrant.platform.auth.service import Authenticator
from hydrant.platform.db.session import Database
from hydrant.platform.digests.alerts import BudgetAlerts
from hydrant.platform.digests.low_balance import LowBalanceAlerts
from hydrant.platform.digests.service import DigestService
from hydrant.platform.jobs.context import JobContext
from hydrant.platform.mail.mailer import Mailer
from hydrant.settings import Settings


async def provide_digest_service(
    database: NamedDependency[Database],
    settings: NamedDependency[Settings],
    mailer: NamedDependency[Mailer],
    authenticator: NamedDependency[Authenticator],
) -> DigestService:
    """For the admin API and the unsubscribe link."""
    return DigestService(database, settings, mailer, authenticator.server_secret)


def digest_service(ctx: JobContext) -> DigestService:
    return DigestService(ctx.database, ctx.settings, ctx.mailer, ctx.server_secret, clock=ctx.clock)


def budget_alerts(ctx: JobContext) -> BudgetAlerts:
    return BudgetAlerts(digest_service(ctx), ctx.enqueue)


def low_balance_alerts(ctx: JobContext) -> LowBalanceAlerts:
    return LowBalanceAlerts(digest_service(ctx), ctx.enqueue)
