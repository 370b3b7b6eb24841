"""bench/paired.py: what a front adds, read from two clients' detailed results."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def paired() -> Any:
    spec = importlib.util.spec_from_file_location("paired_bench", BENCH / "paired.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def result(
    requests: list[tuple[float, float, float, int]], errors: frozenset[int] = frozenset()
) -> dict[str, Any]:
    """A `vllm bench serve --save-detailed` result: (sent at s, TTFT s, latency s, tokens)."""
    return {
        "start_times": [r[0] for r in requests],
        "ttfts": [r[1] for r in requests],
        "latencies": [r[2] for r in requests],
        "output_lens": [r[3] for r in requests],
        "itls": [[(r[2] - r[1]) / (r[3] - 1)] * (r[3] - 1) if r[3] > 1 else [] for r in requests],
        "errors": ["boom" if i in errors else "" for i in range(len(requests))],
    }


def test_the_overlap_is_where_every_arm_was_sending(paired: Any) -> None:
    early = result([(10.0, 0.01, 1.0, 11), (20.0, 0.01, 1.0, 11)])
    late = result([(12.0, 0.01, 1.0, 11), (25.0, 0.01, 1.0, 11)])
    assert paired.overlap([early, late]) == (12.0, 20.0)


def test_figures_count_only_finished_requests_sent_inside_the_span(paired: Any) -> None:
    data = result(
        [
            (1.0, 0.010, 0.110, 11),  # TPOT (0.110 - 0.010) / 10 = 10 ms
            (2.0, 0.030, 0.230, 11),  # 20 ms
            (3.0, 0.500, 9.000, 11),  # failed: not counted
            (9.0, 0.900, 9.900, 11),  # after the span
        ],
        errors=frozenset({2}),
    )
    figures = paired.figures_between(data, 0.5, 5.0)
    assert figures["requests"] == 2
    assert figures["ttft_p50"] == pytest.approx(20.0)
    assert figures["tpot_p50"] == pytest.approx(15.0)
    assert figures["e2e_p50"] == pytest.approx(170.0)
    assert math.isnan(paired.figures_between(data, 100.0, 200.0)["ttft_p50"])


def test_each_request_through_the_front_meets_the_direct_one_sent_nearest(paired: Any) -> None:
    direct = paired.finished(
        result([(1.0, 0.010, 0.110, 11), (2.0, 0.020, 0.220, 11), (3.0, 0.030, 0.330, 11)])
    )
    through = paired.finished(
        result(
            [
                (1.9, 0.025, 0.245, 11),  # nearest: sent at 2.0 (TTFT 20 ms, TPOT 20 ms)
                (2.8, 0.031, 0.361, 11),  # nearest: sent at 3.0 (TTFT 30, TPOT 30)
                (5.0, 0.0, 1.0, 11),  # outside the span
            ]
        )
    )
    matches = paired.matched(direct, through, 0.0, 4.0)
    assert [m.ttft_added for m in matches] == pytest.approx([5.0, 1.0])
    assert [m.tpot_ratio for m in matches] == pytest.approx([22.0 / 20.0, 33.0 / 30.0])
    assert [m.apart for m in matches] == pytest.approx([0.1, 0.2])


def test_the_table_pools_matched_requests_over_the_rounds(paired: Any) -> None:
    direct = result([(float(t), 0.010, 0.110, 11) for t in range(1, 11)])
    rounds = [
        paired.pair_of(
            "5",
            "relay",
            direct,
            result([(t + 0.1, 0.012 + extra, 0.112 + 2 * extra, 11) for t in range(1, 11)]),
            failed=0,
            other_cores=0.0,
            cpu_ms_per_k=30.0,
            front_ms=2.0 + 100 * extra,
            admission_ms=0.3 + 20 * extra,
        )
        for extra in (0.0, 0.010)
    ]
    text = paired.paired_table(rounds, {"relay": "byte relay"}, ("relay",))
    (row,) = [line for line in text.splitlines() if line.startswith("| 5/s")]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1] == "byte relay"
    # TTFT added: +2 ms in one round, +12 in the other; the median of the 20 matches: +7
    assert cells[4].startswith("+7.0 (+2.0 to +12.0)")
    # TPOT: 10 ms direct, 10 and 11 ms through
    assert cells[8].startswith("1.050x (1.000 to 1.100)")
    # the last request through the front was sent after the direct arm's last: 9 a round
    # the front's own time and its quota admission: medians over the rounds
    assert (cells[11], cells[12]) == ("2.50", "0.40")
    assert cells[13] == "18 (2)"
