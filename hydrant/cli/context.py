"""What every command shares: the settings (read once) and logging set up from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from hydrant.errors import ConfigurationError
from hydrant.logs import configure_logging
from hydrant.settings import Settings, load_settings


@dataclass
class CliContext:
    config_file: Path | None
    _settings: Settings | None = field(default=None, init=False)

    def settings(self, **overrides: Any) -> Settings:
        """Read settings once (environment, then `--config`, then command-line flags)."""
        if self._settings is None or overrides:
            try:
                self._settings = load_settings(config_file=self.config_file, **overrides)
            except ConfigurationError as exc:
                raise click.UsageError(str(exc)) from exc
            configure_logging(
                self._settings.log_level, self._settings.log_format, self._settings.log_file
            )
        return self._settings


pass_context = click.make_pass_decorator(CliContext)


def not_yet(feature: str, issue: int) -> None:
    """Refuse honestly: the command exists for its help text, its feature lands later."""
    click.echo(
        f"hydrant: {feature} is not available in this version yet (issue #{issue}).", err=True
    )
    raise SystemExit(2)
