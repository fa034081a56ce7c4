"""The page-against-bench tool reads the page's own status line, and summarises both ways."""

from __future__ import annotations

import pytest
from fake_traces import continuous_trace, static_trace

from engine.page.views import run_status, run_view
from tools import page_gap


def test_the_times_it_reads_are_the_ones_the_page_shows():
    """STATUS_TIMES finds both engines' wall times in the page's real status line."""
    static = static_trace([4, 5, 6], [3, 30, 5], num_slots=2)
    continuous = continuous_trace([4, 5, 6], [3, 30, 5], num_slots=2)
    static.wall_s, continuous.wall_s = 12.25, 6.75  # exact in binary: printed as is
    status = run_status.status_line(run_view.RunState(static, continuous, None))
    found = page_gap.STATUS_TIMES.search(status)
    assert found is not None, status
    assert (float(found[1]), float(found[2])) == (12.25, 6.75)


def test_the_summary_compares_medians_page_over_bench():
    """The summary's ratio is the page's median over the bench's, per engine."""
    page = [
        {"static": 10.0, "continuous": 6.0},
        {"static": 12.0, "continuous": 5.0},
        {"static": 11.0, "continuous": 7.0},
    ]
    bench = [
        {"static": 10.0, "continuous": 5.0},
        {"static": 9.0, "continuous": 6.0},
        {"static": 11.0, "continuous": 4.0},
    ]
    summary = page_gap.compare(page, bench)
    assert summary["static"] == {"page_s": 11.0, "bench_s": 10.0, "ratio": pytest.approx(1.1)}
    assert summary["continuous"]["ratio"] == pytest.approx(6.0 / 5.0)
