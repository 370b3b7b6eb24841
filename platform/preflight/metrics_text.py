"""Reading the Prometheus text exposition the deployment serves at `/metrics`.

Families are kept by their base name (a counter `x` is exposed as `x_total`,
a histogram as `x_bucket`/`x_sum`/`x_count`) so that a metric named in an
alert rule or a dashboard query can be matched whichever form it uses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created", "_info")
METRIC_NAME = re.compile(r"\b((?:hydrant|process)_[a-zA-Z0-9_]+)")


def base_name(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


@dataclass
class Scrape:
    families: set[str] = field(default_factory=set)
    # (sample name, sorted label items) → value
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Scrape:
        scrape = cls()
        for family in text_string_to_metric_families(text):
            scrape.families.add(base_name(family.name))
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                scrape.samples[key] = float(sample.value)
        return scrape

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, tuple(sorted(labels.items()))))

    def has(self, metric: str) -> bool:
        return base_name(metric) in self.families


def names_in(text: str) -> set[str]:
    """Metric names (`hydrant_*`, `process_*`) mentioned in rule or dashboard text, base form."""
    return {base_name(m) for m in METRIC_NAME.findall(text)}


def histogram_mean(before: Scrape, after: Scrape, name: str, **labels: str) -> tuple[float, int]:
    """Mean observation of a histogram between two scrapes, and how many observations."""
    total = (after.value(f"{name}_sum", **labels) or 0.0) - (
        before.value(f"{name}_sum", **labels) or 0.0
    )
    count = (after.value(f"{name}_count", **labels) or 0.0) - (
        before.value(f"{name}_count", **labels) or 0.0
    )
    return (total / count if count > 0 else 0.0), int(count)
