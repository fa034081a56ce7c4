"""Requests arriving over time: Poisson arrivals, admission after arrival, static wave forming,
and waits for arrivals that a stop or the time limit ends."""

import dataclasses
import gc
import threading
import time
import weakref

import pytest
from tiny_model import make_requests, tiny_runner

from engine.batching.continuous import ContinuousEngine
from engine.batching.static import StaticEngine
from engine.config import EngineConfig
from engine.serving.run_control import (
    WAIT_SLICE_S,
    RunCancelled,
    RunControl,
    RunTimedOut,
    wait_until,
)
from engine.workloads.workload import RequestSpec, parse_table, poisson_arrivals


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


def _stop_after(control: RunControl, delay_s: float) -> threading.Timer:
    timer = threading.Timer(delay_s, control.stop)
    timer.start()
    return timer


@pytest.mark.parametrize("engine_cls", [StaticEngine, ContinuousEngine])
@pytest.mark.parametrize(
    ("stop", "error"),
    [("cancel", RunCancelled), ("time_limit", RunTimedOut)],
)
def test_a_stop_ends_an_arrival_wait_within_a_slice(engine_cls, stop, error, monkeypatch):
    """A run waiting for a request due at 30 s ends within 1 s of a stop or of its time limit,
    with no step recorded for the wait and the KV cache freed."""
    runner = tiny_runner()
    caches = []
    new_cache = runner.new_kv_cache

    def tracked_cache(*args, **kwargs):
        cache = new_cache(*args, **kwargs)
        caches.append(weakref.ref(cache))
        return cache

    monkeypatch.setattr(runner, "new_kv_cache", tracked_cache)
    requests = _at(make_requests([("aa", 3), ("late", 3)]), [0.0, 30.0])
    control = RunControl(time_limit_s=0.2 if stop == "time_limit" else None)
    timer = _stop_after(control, 0.2) if stop == "cancel" else None
    seen = []

    def on_wait(trace):
        seen.append(trace)
        control.check()

    engine = engine_cls(runner, EngineConfig(2))
    started_s = time.monotonic()
    with pytest.raises(error):
        engine.run(requests, on_wait=on_wait)
    elapsed_s = time.monotonic() - started_s
    if timer is not None:
        timer.cancel()
    assert elapsed_s < 1.0, f"{engine.name} waited {elapsed_s:.1f} s after the stop"
    assert seen, f"{engine.name} never called on_wait while waiting"
    trace = seen[-1]
    late = trace.request(1)
    assert late.admit_s is None, f"{engine.name} admitted the request due at 30 s"
    assert all(s.request_id == 0 for step in trace.steps for s in step.seqs), "a step for R1"
    if engine_cls is ContinuousEngine:
        assert len(trace.steps) == 3, f"R0 (cap 3) took {len(trace.steps)} steps: a fake step?"
        del seen, trace, late
        gc.collect()
        assert caches and all(ref() is None for ref in caches), "the KV cache outlived the run"


def test_wait_until_calls_back_each_slice_and_returns_on_time():
    """wait_until sleeps to the wake time in slices of WAIT_SLICE_S, calling back after each."""
    calls = []
    t0 = time.perf_counter()
    wait_until(t0, 0.2, lambda: calls.append(time.perf_counter() - t0))
    elapsed_s = time.perf_counter() - t0
    assert 0.2 <= elapsed_s < 0.5, f"woke after {elapsed_s:.3f} s, not at 0.2 s"
    gaps = [b - a for a, b in zip([0.0, *calls], calls, strict=False)]
    assert len(calls) >= 0.2 / WAIT_SLICE_S, f"{len(calls)} callbacks in 0.2 s"
    assert max(gaps) < WAIT_SLICE_S + 0.05, f"a slice of {max(gaps):.3f} s"
    before = len(calls)
    wait_until(t0, 0.0, lambda: calls.append(0.0))
    assert len(calls) == before, "a past wake time still slept or called back"
