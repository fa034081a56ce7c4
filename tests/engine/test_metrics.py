"""Metric formulas against a hand-made trace."""

import pytest

from engine.trace import (
    DECODE,
    IDLE,
    PREFILL,
    RequestRecord,
    ScheduledSeq,
    StepRecord,
    Trace,
    percentile,
)


def _trace() -> Trace:
    """Two slots, three steps: R0 (3 tokens), R1 arrives at 0.5 s and gets 2 tokens."""
    r0 = RequestRecord(0, "a", 3, 4, arrival_s=0.0, admit_s=0.0, first_token_s=1.0, finish_s=3.0)
    r0.output_token_ids = [5, 6, 7]
    r1 = RequestRecord(1, "b", 2, 2, arrival_s=0.5, admit_s=1.0, first_token_s=2.0, finish_s=3.0)
    r1.output_token_ids = [8, 9]
    steps = [
        StepRecord(0, 0.0, 1.0, [ScheduledSeq(0, 0, PREFILL, 4, 0)]),
        StepRecord(
            1, 1.0, 2.0, [ScheduledSeq(0, 0, DECODE, 1, 4), ScheduledSeq(1, 1, PREFILL, 2, 0)]
        ),
        StepRecord(
            2, 2.0, 3.0, [ScheduledSeq(0, 0, DECODE, 1, 5), ScheduledSeq(1, 1, DECODE, 1, 2)]
        ),
    ]
    return Trace("continuous", 2, steps, [r0, r1], wall_s=3.0)


def test_per_request_latencies():
    """Queue time, TTFT, TPOT and e2e latency follow their definitions."""
    r0, r1 = _trace().requests
    assert (r1.queue_s, r1.ttft_s, r1.latency_s) == (0.5, 1.5, 2.5)
    assert r0.tpot_s == pytest.approx((3.0 - 1.0) / 2)
    assert r1.tpot_s == pytest.approx(1.0)


def test_run_metrics():
    """Throughput, requests/s, utilisation and step counts from the hand-made trace."""
    m = _trace().metrics()
    assert m.num_generated_tokens == 5 and m.num_steps == 3
    assert m.tok_per_s == pytest.approx(5 / 3) and m.requests_per_s == pytest.approx(2 / 3)
    assert m.slot_utilisation_pct == pytest.approx(100 * 5 / 6)
    assert m.padding_waste_pct == 0.0
    assert m.mean_ttft_s == pytest.approx((1.0 + 1.5) / 2)


def test_padding_waste_counts_pads_once_and_idle_rows_every_step():
    """A padded prefill wastes its pads; an idle row wastes its token each step."""
    steps = [
        StepRecord(
            0, 0, 1, [ScheduledSeq(0, 0, PREFILL, 2, 0, 2), ScheduledSeq(1, 1, PREFILL, 4, 0)]
        ),
        StepRecord(1, 1, 2, [ScheduledSeq(0, 0, IDLE, 1, 2, 2), ScheduledSeq(1, 1, DECODE, 1, 4)]),
    ]
    trace = Trace("static", 2, steps, [], wall_s=2.0)
    assert trace.padding_waste_pct() == pytest.approx(100 * (2 + 1) / (2 + 2 + 4 + 1 + 1))


def test_percentiles_interpolate_like_numpy():
    """p50 of 1..4 is 2.5; p99 of ten values sits just under the maximum; empty gives None."""
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile(list(range(10)), 99) == pytest.approx(8.91)
    assert percentile([], 50) is None
    pct = _trace().latency_percentiles()
    assert pct["ttft_s"]["p50"] == pytest.approx(1.25) and pct["queue_s"]["p99"] == pytest.approx(
        0.495
    )
