"""The digest's chart: charges per day as a small PNG bar chart, made here with matplotlib.

Why `Figure` and the Agg canvas, not pyplot: pyplot keeps global state and
picks a GUI backend; a job worker needs neither, and two digests rendered in
two threads must not share a figure.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from datetime import date
from decimal import Decimal

HIGHLIGHT = "#1f5fa8"
MUTED = "#9bb5d6"


def daily_chart_png(series: Sequence[tuple[date, Decimal]], title: str) -> bytes:
    """Bars of charged amount per day; the last day (the digest's) is highlighted."""
    # Imported here: only job runners draw charts, and the gateway imports this module.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 2.4), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    labels = [d.strftime("%a %d") for d, _ in series]
    # Bar heights only: the amounts shown as text stay exact Decimals.
    heights = [float(amount) for _, amount in series]
    colors = [MUTED] * (len(series) - 1) + [HIGHLIGHT] if series else []
    axes.bar(labels, heights, color=colors)
    axes.set_title(title, fontsize=10)
    axes.set_ylabel("charged", fontsize=8)
    axes.tick_params(labelsize=7)
    axes.spines[["top", "right"]].set_visible(False)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": "hydrant"})
    return buffer.getvalue()
