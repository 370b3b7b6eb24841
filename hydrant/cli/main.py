"""Entry point of the `hydrant` command."""

from __future__ import annotations

from pathlib import Path

import click

from hydrant import __version__
from hydrant.cli.admin import keys, tenants
from hydrant.cli.batchcmd import batches
from hydrant.cli.billingcmd import billing
from hydrant.cli.context import CliContext
from hydrant.cli.creditcmd import credits_group
from hydrant.cli.database import migrate
from hydrant.cli.jobscmd import jobs
from hydrant.cli.modelcmds import capacity, demo_model, models
from hydrant.cli.preflightcmd import preflight
from hydrant.cli.projectcmd import projects
from hydrant.cli.reportcmd import report
from hydrant.cli.serve import serve
from hydrant.cli.workercmd import worker
from hydrant.engine.errors import ModelLoadError
from hydrant.errors import ConfigurationError


class HydrantGroup(click.Group):
    """Settings that cannot work end a command as a usage error (one line, exit code 2).

    Most of them are found while the settings are read (`CliContext.settings`),
    but some only when a part is built from them: the bootstrap admin key in
    the app, what worker pools need, a model directory that is not a checkpoint
    this engine serves. Those would otherwise end in a Python traceback that
    buries the one line saying what to fix.
    """

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except (ConfigurationError, ModelLoadError) as exc:
            raise click.UsageError(str(exc)) from exc


@click.group(cls=HydrantGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hydrant")
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="TOML settings file ([hydrant] table); HYDRANT_* variables override it.",
)
@click.pass_context
def cli(ctx: click.Context, config_file: Path | None) -> None:
    """Hydrant: multi-tenant LLM inference with metering, quotas and billing.

    With no configuration, `hydrant serve` runs everything from one command:
    SQLite, in-memory limits, a generated demo model and its CPU engine (in a
    child process of the server).
    """
    ctx.obj = CliContext(config_file=config_file)


for command in (
    serve,
    worker,
    migrate,
    tenants,
    keys,
    projects,
    batches,
    billing,
    credits_group,
    models,
    report,
    capacity,
    demo_model,
    jobs,
):
    cli.add_command(command)
cli.add_command(preflight)


def main() -> None:
    cli(prog_name="hydrant")
