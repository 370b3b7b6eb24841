"""Digest mail as MIME: text and HTML (jinja2 templates in this package) and the inline chart.

The message is multipart/alternative: the plain text part, then a
multipart/related holding the HTML and the PNG it shows through `cid:`. Every
message is for one recipient, because its unsubscribe link (in the body and
in `List-Unsubscribe`) is that recipient's own.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from email.message import EmailMessage
from email.utils import format_datetime
from functools import cache
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from hydrant.platform.billing.money import REPORT_PLACES, round_money

CHART_CID = "digest-chart@hydrant"
CENT = Decimal("0.01")


def money(amount: Decimal) -> str:
    """Cents, rounded once with THE rounding function (as the reports' `rounded` totals).

    A non-zero amount under a cent reads `<0.01`, not `0.00`: small tenants would
    otherwise get a digest full of zeros for usage they did pay for.
    """
    if 0 < abs(amount) < CENT:
        return "<0.01" if amount > 0 else "-<0.01"
    return f"{round_money(amount, REPORT_PLACES):,f}"


def percent(value: Decimal | None) -> str:
    if value is None:
        return "n/a"
    return f"{round_money(value, 1):+f}%"


def share(value: Decimal) -> str:
    return f"{round_money(value, 1):f}%"


def number(value: int | Decimal) -> str:
    return f"{value:,}"


@cache
def environment() -> Environment:
    env = Environment(
        loader=PackageLoader("hydrant.platform.digests", "templates"),
        autoescape=select_autoescape(enabled_extensions=("html",), default=False),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(money=money, percent=percent, share=share, number=number)
    return env


@dataclass(frozen=True)
class Rendered:
    subject: str
    text: str
    html: str
    chart_png: bytes | None


def render(template: str, subject: str, chart_png: bytes | None, **context: Any) -> Rendered:
    """`template`.txt and `template`.html with the same context."""
    env = environment()
    context = {**context, "chart_cid": CHART_CID if chart_png else None}
    return Rendered(
        subject=subject,
        text=env.get_template(f"{template}.txt").render(**context),
        html=env.get_template(f"{template}.html").render(**context),
        chart_png=chart_png,
    )


def build_message(
    rendered: Rendered,
    *,
    sender: str,
    recipient: str,
    message_key: str,
    unsubscribe_url: str | None,
    now: datetime | None = None,
) -> EmailMessage:
    """The MIME message; `message_key` makes the Message-ID stable for one digest and recipient."""
    message = EmailMessage()
    # One line: a header refuses a line break, and a name in the subject (a tenant's, a
    # project's) may hold one; the mail would otherwise fail on every retry.
    message["Subject"] = " ".join(rendered.subject.split())
    message["From"] = sender
    message["To"] = recipient
    message["Date"] = format_datetime(now or datetime.now(UTC))
    digest = hashlib.sha256(f"{message_key}|{recipient}".encode()).hexdigest()[:32]
    message["Message-ID"] = f"<{digest}@hydrant>"
    if unsubscribe_url is not None:
        message["List-Unsubscribe"] = f"<{unsubscribe_url}>"
        message["List-Unsubscribe-Post"] = "List-Unsubscribe=One-Click"
    message.set_content(rendered.text)
    message.add_alternative(rendered.html, subtype="html")
    if rendered.chart_png is not None:
        html_part = next(p for p in message.iter_parts() if p.get_content_type() == "text/html")
        html_part.add_related(
            rendered.chart_png,
            maintype="image",
            subtype="png",
            cid=f"<{CHART_CID}>",
            filename="chart.png",
            disposition="inline",
        )
    return message
