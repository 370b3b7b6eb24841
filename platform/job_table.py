"""Every job by name, and the periodic schedule: one table for Celery beat and the embedded loop.

Like the app's one list of controllers (app.py), this is the one place that
names every domain's jobs; the jobs package only runs a table it is given.
"""

from __future__ import annotations

from hydrant.platform.adapters.tasks import TASKS as ADAPTER_TASKS
from hydrant.platform.batches.tasks import TASKS as BATCH_TASKS
from hydrant.platform.credits.tasks import TASKS as CREDIT_TASKS
from hydrant.platform.digests.tasks import TASKS as DIGEST_TASKS
from hydrant.platform.dispatch.tasks import TASKS as POOL_TASKS
from hydrant.platform.files.tasks import TASKS as FILE_TASKS
from hydrant.platform.inference.responses.tasks import TASKS as RESPONSE_TASKS
from hydrant.platform.invoices.tasks import TASKS as INVOICE_TASKS
from hydrant.platform.jobs.registry import JobTable, Periodic
from hydrant.platform.ledger.tasks import TASKS as LEDGER_TASKS
from hydrant.platform.reconciliation.tasks import TASKS as RECONCILIATION_TASKS
from hydrant.platform.reports.tasks import TASKS as REPORT_TASKS
from hydrant.platform.usage_export.tasks import TASKS as USAGE_EXPORT_TASKS

# Digests and alerts are checked every few minutes, not once at the hour: the check
# sends only what is due and not yet claimed, so a tick missed (beat or gateway down)
# is caught up by the next one, and extra ticks cost one query.
PERIODIC: tuple[Periodic, ...] = (
    Periodic("daily-digests", "hydrant.digests.dispatch", 300.0),
    Periodic("budget-alerts", "hydrant.budgets.check", 300.0),
    # Every minute: a crossing is mailed within a minute (digests/low_balance.py says why
    # a periodic check and not the settlement); it reads only tenants with thresholds.
    Periodic("low-balance-alerts", "hydrant.credits.check_low_balance", 60.0),
    # Every minute: entries that reached the ledger late (spool, journal) or of post-paid
    # tenants with credits are paid within a minute (credits/payer.py says why); one
    # query when nothing is pending.
    Periodic("credit-payments", "hydrant.credits.pay_pending", 60.0),
    Periodic("hourly-ledger-rollups", "hydrant.ledger.rollup", 3600.0),
    # Hourly, and idempotent per adapter and day (adapters/hosting.py): a day is charged once.
    Periodic("adapter-hosting-fees", "hydrant.adapters.hosting_fees", 3600.0),
    # Hourly: a tenant's month closes at its own local midnight, so some tenant's month
    # ends every hour of the 1st; a finalized month costs one query per tenant to skip.
    Periodic("monthly-invoices", "hydrant.invoices.finalize", 3600.0),
    # Every minute: closed hours become records, and due records (new, retried after the
    # backoff, or left `sending` by a dead exporter) are delivered; off with no receiver.
    Periodic("usage-export", "hydrant.billing.export_usage", 60.0),
    # Hourly, idempotent per day (reconciliation/tasks.py): yesterday and today's rows.
    Periodic("cost-reconciliation", "hydrant.billing.reconcile", 3600.0),
    Periodic("stored-responses-purge", "hydrant.responses.purge", 3600.0),
    Periodic("files-purge", "hydrant.files.purge", 3600.0),
    # Hourly, like the two above: past their retentions, the usage export's delivered
    # records (usage_export/retention.py) and the reconciliation's rows and timeline.
    Periodic("usage-export-purge", "hydrant.billing.purge_usage_export", 3600.0),
    Periodic("reconciliation-purge", "hydrant.billing.purge_reconciliation", 3600.0),
    # Starts batches no runner holds: a new one whose run was not enqueued, or one whose
    # runner died (its lease lapsed), so a batch resumes within a lease and a sweep.
    Periodic("batches-sweep", "hydrant.batches.sweep", 10.0),
    # The gateway replays its own spool every few seconds; this is for one that stopped.
    Periodic("spool-replay", "hydrant.ledger.replay_spool", 60.0, embedded=False),
    # Pools exist only with Redis, where Celery beat runs this; a gateway with pools also
    # scales its own down in its idle loop (the same `scale_down`), so nothing is lost
    # on the embedded default, which has no worker registry to read.
    Periodic("scale-to-zero-reaper", "hydrant.pools.reap", 60.0, embedded=False),
)

# What a gateway whose engines live in it runs on its own loop when Celery runs the rest.
BATCH_PERIODIC = tuple(p for p in PERIODIC if p.job == "hydrant.batches.sweep")

JOB_TABLE = JobTable.of(
    (
        *DIGEST_TASKS,
        *REPORT_TASKS,
        *LEDGER_TASKS,
        *RESPONSE_TASKS,
        *FILE_TASKS,
        *BATCH_TASKS,
        *CREDIT_TASKS,
        *POOL_TASKS,
        *ADAPTER_TASKS,
        *INVOICE_TASKS,
        *USAGE_EXPORT_TASKS,
        *RECONCILIATION_TASKS,
    ),
    PERIODIC,
)
