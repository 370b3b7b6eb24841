"""The SVG charts: exact values in `data-value`, geometry that follows them, escaped labels."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from decimal import Decimal

from hydrant.web.charts import Bar, Series, bar_chart, line_chart, nice_ceiling

SVG = "{http://www.w3.org/2000/svg}"


def test_nice_ceiling() -> None:
    assert nice_ceiling(0) == 1
    assert nice_ceiling(3) == 4
    assert nice_ceiling(10) == 10
    assert nice_ceiling(11) == 20
    assert nice_ceiling(0.0003) == 0.0004
    assert nice_ceiling(5000) == 6000
    assert nice_ceiling(0.000023) == 0.00004


def test_line_chart_points_carry_exact_values_and_heights_follow_them() -> None:
    svg = str(
        line_chart(
            "cost",
            "Cost per day",
            ["2026-03-04", "2026-03-05", "2026-03-06"],
            [
                Series(
                    "charged", [Decimal("0"), Decimal("0.000012"), Decimal("0.000006")], "series-1"
                )
            ],
        )
    )
    root = ET.fromstring(svg)  # well-formed XML
    assert root.get("role") == "img"
    assert root.find(f"{SVG}title") is not None and root.find(f"{SVG}desc") is not None
    circles = root.findall(f".//{SVG}circle")
    assert [c.get("data-value") for c in circles] == ["0", "0.000012", "0.000006"]
    ys = [float(c.get("cy", "nan")) for c in circles]
    assert ys[1] < ys[2] < ys[0]  # higher value, higher on the page (smaller y)
    assert "0.000018" in (root.find(f"{SVG}desc").text or "")  # the total is described


def test_a_single_bucket_and_an_empty_chart_render() -> None:
    one = ET.fromstring(
        str(line_chart("r", "Requests", ["2026-03-05"], [Series("requests", [4], "s")]))
    )
    assert [c.get("data-value") for c in one.iter(f"{SVG}circle")] == ["4"]
    empty = ET.fromstring(str(bar_chart("by-model", "Charged by model", [])))
    assert "No usage" in "".join(empty.itertext())


def test_labels_are_escaped() -> None:
    evil = '<script>alert("x")</script>'
    svg = str(bar_chart("by-model", "Charged", [Bar(evil, Decimal("1.5"), "1.50")]))
    assert "<script>" not in svg
    root = ET.fromstring(svg)
    group = root.find(f"{SVG}g")
    assert group is not None and group.get("data-label") == evil
    assert group.get("data-value") == "1.5"


def test_bars_are_proportional() -> None:
    svg = str(bar_chart("m", "t", [Bar("a", Decimal("4"), "4"), Bar("b", Decimal("1"), "1")]))
    widths = [float(w) for w in re.findall(r'<rect x="8" y="[^"]+" width="([^"]+)"', svg)]
    assert widths[0] == 4 * widths[1]
