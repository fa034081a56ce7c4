"""Requests arriving over time: Poisson arrivals, admission after arrival, static wave forming."""

import dataclasses

import pytest
from tiny_model import make_requests, tiny_runner

from engine.config import EngineConfig
from engine.continuous import ContinuousEngine
from engine.static import StaticEngine
from engine.workload import RequestSpec, parse_table, poisson_arrivals


def _at(requests, arrivals):
    return [dataclasses.replace(r, arrival_s=a) for r, a in zip(requests, arrivals, strict=True)]


def test_poisson_arrivals_are_reproducible_for_a_seed():
    """The same seed gives the same arrival times; another seed gives others; times increase."""
    specs = [RequestSpec("p", 3)] * 20
    a = [s.arrival_s for s in poisson_arrivals(specs, 5.0, seed=1)]
    b = [s.arrival_s for s in poisson_arrivals(specs, 5.0, seed=1)]
    c = [s.arrival_s for s in poisson_arrivals(specs, 5.0, seed=2)]
    assert a == b and a != c
    assert all(x < y for x, y in zip(a, a[1:], strict=False)) and a[0] > 0
    assert 1.0 < a[-1] < 10.0, "20 arrivals at 5/s should take about 4 s"
    with pytest.raises(ValueError, match="rate must be positive"):
        poisson_arrivals(specs, 0.0, seed=1)


def test_table_specs_start_at_time_zero():
    """Without an arrival column every request arrives at t = 0."""
    assert {s.arrival_s for s in parse_table([["a", 2], ["b", 3]])} == {0.0}


def test_continuous_admits_only_after_arrival():
    """No request is admitted before it arrives; with a free slot, at the first step end after."""
    runner = tiny_runner()
    requests = _at(make_requests([("aa", 6), ("bbb", 6), ("c", 4)]), [0.0, 0.08, 0.15])
    trace = ContinuousEngine(runner, EngineConfig(3)).run(requests)
    for r in trace.requests:
        assert r.admit_s >= r.arrival_s, f"R{r.request_id} admitted before it arrived"
        missed = [st.index for st in trace.steps if r.arrival_s <= st.end_s < r.admit_s]
        assert not missed, f"R{r.request_id} had a free slot but waited past steps {missed}"
        assert r.ttft_s >= 0
    assert trace.wall_s >= 0.15


def test_static_wave_waits_to_fill_then_times_out():
    """A wave starts when B requests arrived, or when the oldest waited wave_timeout_s."""
    runner = tiny_runner()
    requests = _at(make_requests([("aa", 3), ("bb", 3), ("cc", 3)]), [0.0, 0.05, 0.6])
    trace = StaticEngine(runner, EngineConfig(3, wave_timeout_s=0.2)).run(requests)
    r0, r1, r2 = trace.requests
    assert r0.admit_s == r1.admit_s, "R0 and R1 share the first wave"
    assert 0.2 <= r0.admit_s < 0.55, "that wave starts at the timeout, not at R2's arrival"
    assert r2.admit_s >= 0.6 and r2.admit_s > r0.finish_s, "R2 forms a second wave"
    assert len({s.wave for s in trace.steps}) == 2
