"""LoadReport: phases add up, only the active report records, wall time wins when set."""

from __future__ import annotations

import threading

from hydrant.engine.load_report import LoadReport, timed_phase


def test_only_the_active_report_records_and_repeats_add_up() -> None:
    outer, inner = LoadReport("load"), LoadReport("wake")
    with timed_phase("nobody"):  # no active report: a no-op
        pass
    with outer.active():
        with timed_phase("a"):
            pass
        with inner.active(), timed_phase("b"):
            pass
        with timed_phase("a"):
            pass
    assert list(outer.phases) == ["a"] and list(inner.phases) == ["b"]
    outer.add("a", 1.0)
    assert outer.phases["a"] >= 1.0
    assert outer.total_seconds == sum(outer.phases.values())
    outer.wall_seconds = 5.0
    assert outer.total_seconds == 5.0
    assert outer.as_dict()["total"] == 5.0


def test_a_phase_that_raises_is_still_timed() -> None:
    report = LoadReport()
    with report.active():
        try:
            with timed_phase("broken"):
                raise RuntimeError("boom")
        except RuntimeError:
            pass
    assert "broken" in report.phases


def test_reports_do_not_leak_across_threads() -> None:
    report = LoadReport()
    seen: list[bool] = []

    def other() -> None:
        with timed_phase("elsewhere"):
            seen.append(True)

    with report.active():
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert seen == [True] and "elsewhere" not in report.phases
