"""Resolve a `hydrant ...` command line through the real click tree, the way the shell would."""

from __future__ import annotations

import click

from hydrant.cli.main import cli


def parse_cli(argv: list[str]) -> click.Command:
    """The command `argv` runs; raises on an unknown command, option, or a missing argument."""
    assert argv[0] == "hydrant", argv
    command: click.Command = cli
    args = argv[1:]
    parent = cli.make_context("hydrant", [], resilient_parsing=True)
    while isinstance(command, click.Group) and args and not args[0].startswith("-"):
        sub = command.get_command(parent, args[0])
        assert sub is not None, f"no command {args[0]!r} in {argv}"
        command, args = sub, args[1:]
        parent = click.Context(command, parent=parent, info_name=command.name)
    # parses every option and argument (unknown options, missing required ones raise)
    command.make_context(command.name or "hydrant", list(args), parent=parent.parent)
    return command
