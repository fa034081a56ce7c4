"""The trace's JSON: ``trace_codec.encode`` read back by ``trace_codec.decode``, a server's own
record of its steps (``schedule``: vLLM's, from a record captured from a real vLLM) included,
and a trace without one written as before."""

from __future__ import annotations

import json

import pytest
from captured_vllm import captured_vllm_trace
from fake_traces import continuous_trace

from engine import trace_codec
from engine.sampling_params import SamplingParams
from engine.trace import DECODE, PREFILL, ScheduledSeq, ServerSample, StepRecord, Trace

OLD_KEYS = {
    "engine",
    "num_slots",
    "kv_mode",
    "wall_s",
    "info",
    "metrics",
    "latency_percentiles",
    "steps",
    "requests",
    "server_samples",
    "warnings",
}


def _through_json(trace: Trace) -> Trace:
    return trace_codec.decode(json.loads(json.dumps(trace_codec.encode(trace))))


def test_vllms_own_record_round_trips_through_json():
    """vLLM's trace with its own record comes back from JSON with every step of the record: lanes,
    tokens, vLLM's block ids, shared prefix blocks, preemptions, and its requests' cache hits."""
    trace = captured_vllm_trace()
    trace.server_samples = [ServerSample(0.5, {"num_requests_running": 2.0})]
    trace.warnings = ["a warning"]
    back = _through_json(trace)
    schedule = trace.schedule
    assert back.schedule is not None, "the record was lost"
    assert back.schedule.steps == schedule.steps, "a step of vLLM's record changed"
    assert back.schedule.requests == schedule.requests
    assert back.schedule.info == schedule.info and back.schedule.num_slots == schedule.num_slots
    assert any(s.preempted for s in back.schedule.steps), "the capture's preemption was lost"
    assert any(s.shared_blocks for s in back.schedule.steps), "its shared blocks were lost"
    assert back.requests == trace.requests and back.server_samples == trace.server_samples
    assert back.warnings == trace.warnings and back.wall_s == trace.wall_s
    assert trace_codec.encode(back) == trace_codec.encode(trace), "a second trip writes other JSON"


def test_a_trace_without_a_record_keeps_its_json():
    """Our engines' JSON has the keys it always had (no ``schedule``), and reads back whole, block
    tables keyed by request id and sampling settings included."""
    trace = continuous_trace([5, 9, 3], [4, 6, 2], num_slots=2)
    trace.steps[1].block_tables = {0: [1, 2], 1: [3]}
    trace.requests[2].sampling = SamplingParams(temperature=0.7, top_k=5, seed=3)
    data = trace_codec.encode(trace)
    assert set(data) == OLD_KEYS, f"the JSON's keys changed: {set(data) ^ OLD_KEYS}"
    back = _through_json(trace)
    assert back.schedule is None
    assert back.steps == trace.steps and back.steps[1].block_tables == {0: [1, 2], 1: [3]}
    assert back.requests[2].sampling == trace.requests[2].sampling
    assert back.metrics() == trace.metrics()


def test_unknown_keys_are_ignored():
    """A later version's extra keys (top level, steps, requests) do not stop an older reader."""
    data = trace_codec.encode(continuous_trace([4], [2], num_slots=1))
    data["new_field"] = 1
    data["steps"][0]["new_step_field"] = 2
    data["requests"][0]["new_request_field"] = 3
    assert len(trace_codec.decode(data).steps) == len(data["steps"])


def _step(index: int, duration_s: float, seqs: list[ScheduledSeq]) -> StepRecord:
    return StepRecord(index, index * 1.0, index * 1.0 + duration_s, seqs)


def test_prefill_split_times_each_prefill_step_beyond_a_decode_step():
    """Decode steps of 0.10, 0.10 and 0.40 s (median 0.10): a step prefilling 40 tokens with 10
    of left padding in 0.60 s, and one with a 20-token chunk beside a decode in 0.30 s, give 70
    prompt positions in 0.5 + 0.2 s."""
    decode = [ScheduledSeq(0, 0, DECODE, 1, 5)]
    trace = Trace(engine="static", num_slots=2)
    trace.steps = [
        _step(0, 0.60, [ScheduledSeq(0, 0, PREFILL, 40, 0, num_padding_tokens=10)]),
        _step(1, 0.10, decode),
        _step(2, 0.40, decode),
        _step(3, 0.30, decode + [ScheduledSeq(1, 1, PREFILL, 20, 0)]),
        _step(4, 0.10, decode),
    ]
    tokens, seconds = trace.prefill_split()
    assert tokens == 70 and seconds == pytest.approx(0.5 + 0.2)


def test_prefill_split_of_a_run_with_no_decode_step_or_no_prefill():
    """Every step prefilled: the shortest is the step's own cost. No prefill step: nothing."""
    trace = Trace(engine="continuous", num_slots=1)
    trace.steps = [
        _step(0, 0.5, [ScheduledSeq(0, 0, PREFILL, 30, 0)]),
        _step(1, 0.2, [ScheduledSeq(1, 0, PREFILL, 4, 0)]),
    ]
    assert trace.prefill_split() == (34, pytest.approx(0.3))
    trace.steps = [_step(0, 0.5, [ScheduledSeq(0, 0, DECODE, 1, 3)])]
    assert trace.prefill_split() == (0, 0.0)
