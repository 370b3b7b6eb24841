"""`hydrant migrate`: move the schema of the configured database between revisions."""

from __future__ import annotations

import click

from hydrant.cli.context import CliContext, pass_context


@click.group(invoke_without_command=True)
@click.pass_context
def migrate(ctx: click.Context) -> None:
    """Upgrade the database to the newest schema (the default), or move it with a subcommand."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(up)


@migrate.command()
@click.argument("revision", default="head")
@pass_context
def up(cli: CliContext, revision: str) -> None:
    """Upgrade to REVISION (default: head)."""
    from hydrant.platform.db import migrate as runner

    settings = cli.settings()
    runner.upgrade(settings.effective_database_url, revision)
    click.echo(f"database at {revision}")


@migrate.command()
@click.argument("revision")
@pass_context
def down(cli: CliContext, revision: str) -> None:
    """Downgrade to REVISION (`base` removes every table)."""
    from hydrant.platform.db import migrate as runner

    runner.downgrade(cli.settings().effective_database_url, revision)
    click.echo(f"database at {revision}")


@migrate.command()
@pass_context
def check(cli: CliContext) -> None:
    """Fail when the models and the migrations disagree (a migration is missing)."""
    from hydrant.platform.db import migrate as runner

    runner.check(cli.settings().effective_database_url)
    click.echo("models and migrations agree")
