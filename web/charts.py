"""Charts of the cost report as SVG, drawn on the server by this module.

Why our own SVG and not a charting library: the pages need no JavaScript and
no build step, the markup stays accessible (`role="img"`, a title and a
description naming the numbers), and every mark carries its exact value in
`data-value` (the report's own decimal text), so a test or a screen reader
gets the number, not a pixel height. Pixel geometry is the only place a
float appears, and it is never read back as money.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from html import escape

from markupsafe import Markup

WIDTH = 640
HEIGHT = 260
PAD_LEFT = 100
PAD_RIGHT = 16
PAD_TOP = 16
PAD_BOTTOM = 56
MAX_MARKERS = 62  # beyond this many points a line has no circles (hourly reports)
_ids = itertools.count(1)

Number = int | Decimal


@dataclass(frozen=True)
class Series:
    name: str
    values: Sequence[Number]
    css_class: str  # colour comes from the stylesheet (`.series-1` …), not from here


@dataclass(frozen=True)
class Bar:
    label: str
    value: Decimal
    text: str  # the value as the page writes it


def _text(value: Number) -> str:
    return f"{value:f}" if isinstance(value, Decimal) else str(value)


def nice_ceiling(value: float) -> float:
    """The axis top: the next 1, 2, 4, 6 or 8 × 10ⁿ at or above `value` (1 for 0)."""
    if value <= 0:
        return 1.0
    magnitude = 10.0 ** math.floor(math.log10(value))
    for step in (1, 2, 4, 6, 8):  # quarters of these have at most two significant digits
        if value <= step * magnitude * (1 + 1e-12):
            return step * magnitude
    return 10 * magnitude


def _axis_label(value: float) -> str:
    """Fixed notation (money axes run to micro-units; `1e-05` reads badly)."""
    if value == int(value):
        return f"{int(value):,}"
    return f"{value:.8f}".rstrip("0").rstrip(".")


def _open(kind: str, title: str, description: str, height: int = HEIGHT) -> tuple[str, list[str]]:
    n = next(_ids)
    title_id, desc_id = f"chart-{n}-title", f"chart-{n}-desc"
    parts = [
        f'<svg class="chart chart-{kind}" role="img" viewBox="0 0 {WIDTH} {height}"'
        f' aria-labelledby="{title_id} {desc_id}" xmlns="http://www.w3.org/2000/svg"'
        f' data-chart="{escape(kind)}">',
        f'<title id="{title_id}">{escape(title)}</title>',
        f'<desc id="{desc_id}">{escape(description)}</desc>',
    ]
    return title_id, parts


def line_chart(
    kind: str,
    title: str,
    labels: Sequence[str],
    series: Sequence[Series],
    unit: str = "",
    ticks: Sequence[str] | None = None,
) -> Markup:
    """One line per series over `labels` (the buckets); the y axis starts at zero.

    `ticks` are shorter texts for the x axis (`12-02` for `2026-12-02`); the
    points keep the full label in `data-bucket`.
    """
    tick_texts = ticks if ticks is not None else labels
    _, parts = _open(kind, title, _describe_lines(labels, series, unit))
    plot_w = WIDTH - PAD_LEFT - PAD_RIGHT
    plot_h = HEIGHT - PAD_TOP - PAD_BOTTOM
    peak = max((float(v) for s in series for v in s.values), default=0.0)
    top = nice_ceiling(peak)
    count = len(labels)

    def x(i: int) -> float:
        return PAD_LEFT + (plot_w / 2 if count == 1 else plot_w * i / (count - 1))

    def y(value: Number) -> float:
        return PAD_TOP + plot_h * (1 - float(value) / top)

    parts.append('<g class="axis" aria-hidden="true">')
    for fraction in (0, 0.25, 0.5, 0.75, 1):
        gy = PAD_TOP + plot_h * (1 - fraction)
        parts.append(
            f'<line class="grid" x1="{PAD_LEFT}" x2="{WIDTH - PAD_RIGHT}"'
            f' y1="{gy:.1f}" y2="{gy:.1f}"/>'
            f'<text class="tick" x="{PAD_LEFT - 6}" y="{gy + 4:.1f}" text-anchor="end">'
            f"{escape(_axis_label(top * fraction))}</text>"
        )
    for i in _label_positions(count):
        anchor = "middle"
        if count > 1 and i == 0:
            anchor = "start"
        elif count > 1 and i == count - 1:
            anchor = "end"
        parts.append(
            f'<text class="tick" x="{x(i):.1f}" y="{HEIGHT - PAD_BOTTOM + 18}"'
            f' text-anchor="{anchor}">{escape(tick_texts[i])}</text>'
        )
    parts.append("</g>")
    for s in series:
        points = [(x(i), y(v)) for i, v in enumerate(s.values)]
        parts.append(f'<g class="series {escape(s.css_class)}" data-series="{escape(s.name)}">')
        if len(points) > 1:
            path = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
            parts.append(f'<polyline fill="none" points="{path}"/>')
        for i, (px, py) in enumerate(points):
            value = _text(s.values[i])
            radius = 3.5 if count <= MAX_MARKERS else 0
            parts.append(
                f'<circle cx="{px:.1f}" cy="{py:.1f}" r="{radius}"'
                f' data-bucket="{escape(labels[i])}" data-value="{escape(value)}">'
                f"<title>{escape(s.name)}, {escape(labels[i])}: {escape(value)}{unit}</title>"
                "</circle>"
            )
        parts.append("</g>")
    parts.append(_legend([s.name for s in series], [s.css_class for s in series]))
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704 - every interpolated text is escaped above


def bar_chart(kind: str, title: str, bars: Sequence[Bar], unit: str = "") -> Markup:
    """Horizontal bars, largest first as given; the label sits above its bar."""
    row_h = 44
    height = PAD_TOP + max(1, len(bars)) * row_h + 8
    description = (
        "; ".join(f"{b.label}: {b.text}{unit}" for b in bars) if bars else "no data in this period"
    )
    _, parts = _open(kind, title, description, height)
    peak = max((float(b.value) for b in bars), default=0.0)
    top = nice_ceiling(peak)
    plot_w = WIDTH - PAD_RIGHT - 8
    if not bars:
        parts.append(f'<text class="empty" x="{WIDTH / 2}" y="{height / 2}" text-anchor="middle">')
        parts.append("No usage in this period</text>")
    for i, bar in enumerate(bars):
        top_y = PAD_TOP + i * row_h
        width = max(1.0, plot_w * float(bar.value) / top) if bar.value > 0 else 0.0
        parts.append(
            f'<g class="bar series-{i % 6 + 1}" data-label="{escape(bar.label)}"'
            f' data-value="{escape(_text(bar.value))}">'
            f'<text class="bar-label" x="8" y="{top_y + 18}">'
            f"{escape(bar.label)} — {escape(bar.text)}{unit}</text>"
            f'<rect x="8" y="{top_y + 24}" width="{width:.1f}" height="12" rx="2"/>'
            "</g>"
        )
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704 - every interpolated text is escaped above


def _label_positions(count: int, most: int = 5) -> list[int]:
    if count <= most:
        return list(range(count))
    step = (count - 1) / (most - 1)
    return sorted({round(i * step) for i in range(most)})


def _legend(names: Sequence[str], classes: Sequence[str]) -> str:
    if len(names) < 2:
        return ""
    parts = ['<g class="legend" aria-hidden="true">']
    x = PAD_LEFT
    y = HEIGHT - 8
    for name, css in zip(names, classes, strict=True):
        parts.append(
            f'<rect class="{escape(css)}" x="{x}" y="{y - 9}" width="10" height="10"/>'
            f'<text x="{x + 14}" y="{y}">{escape(name)}</text>'
        )
        x += 28 + 11 * len(name)
    parts.append("</g>")
    return "".join(parts)


def _describe_lines(labels: Sequence[str], series: Sequence[Series], unit: str) -> str:
    if not labels:
        return "no data in this period"
    pieces = []
    for s in series:
        total = sum(s.values, Decimal(0)) if s.values else 0
        pieces.append(f"{s.name}: {_text(total)}{unit} in total over {len(labels)} buckets")
    return f"From {labels[0]} to {labels[-1]}. " + "; ".join(pieces) + "."
