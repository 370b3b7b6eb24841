"""The pages' jinja2 environment: templates shipped inside the package, autoescaped.

Rendered by hand (not Litestar's app-wide template config) so the web pages
stay one router the app mounts, with nothing added to the app's own config.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from hydrant.platform.billing.money import REPORT_PLACES, round_money

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"


def money(value: Decimal | str | None, places: int = REPORT_PLACES) -> str:
    """Money as a person reads it: rounded once, with the project's one rounding function."""
    if value is None:
        return "—"
    rounded = round_money(Decimal(value), places)
    # A tiny negative margin rounds to -0.00; a person reads that as a sign error.
    return f"{rounded.copy_abs() if rounded.is_zero() else rounded:,f}"


def count(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def moment(value: datetime | None) -> str:
    return "—" if value is None else value.strftime("%Y-%m-%d %H:%M UTC")


@lru_cache(maxsize=1)
def environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(["html"]),
        undefined=StrictUndefined,  # a misspelt variable is an error in tests, not a blank
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["money"] = money
    env.filters["count"] = count
    env.filters["moment"] = moment
    return env


def render_template(name: str, **context: Any) -> str:
    return environment().get_template(name).render(**context)
