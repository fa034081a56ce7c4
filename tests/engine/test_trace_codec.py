"""The trace's one codec, compact form: it reads the shipped recording and writes it again byte
for byte, keeps every field the full form keeps (times to 0.1 ms), and is several times smaller."""

from __future__ import annotations

import dataclasses
import json

from captured_vllm import captured_vllm_trace
from fake_traces import continuous_trace, static_trace

from engine import trace_codec
from engine.sampling_params import SamplingParams
from engine.trace import ServerSample, Trace

RECORDING = "assets/recorded_run.json"
TIMES = ("arrival_s", "admit_s", "first_token_s", "finish_s")


def _round_times(trace: Trace) -> Trace:
    """Times to 0.1 ms, as the compact form keeps them (0.30000000000000004 becomes 0.3)."""
    for step in trace.steps:
        step.start_s, step.end_s = round(step.start_s, 4), round(step.end_s, 4)
        step.forward_s = None if step.forward_s is None else round(step.forward_s, 4)
    for r in trace.requests:
        for name in TIMES:
            if getattr(r, name) is not None:
                setattr(r, name, round(getattr(r, name), 4))
        r.token_times_s = [round(t, 4) for t in r.token_times_s]
    trace.wall_s = round(trace.wall_s, 4)
    if trace.schedule is not None:
        _round_times(trace.schedule)
    return trace


def _compact_trip(trace: Trace) -> Trace:
    text = json.dumps(trace_codec.encode(trace, compact=True), separators=(",", ":"))
    return trace_codec.decode(json.loads(text))


def test_the_shipped_recording_reads_and_writes_back_unchanged():
    """Each trace of ``assets/recorded_run.json`` decodes and encodes
    again, compact, to the very values in the file."""
    data = json.loads(open(RECORDING, encoding="utf-8").read())
    for name in ("static", "continuous"):
        trace = trace_codec.decode(data[name])
        assert trace.steps and trace.requests, f"{name}: nothing read"
        again = json.loads(json.dumps(trace_codec.encode(trace, compact=True)))
        assert again == data[name], f"{name}: written otherwise"


def test_compact_keeps_what_the_full_form_keeps():
    """Static and paged traces with padding, waves, block tables, shared blocks, prefix-cached
    tokens, sampling and server samples, and vLLM's trace with its own record, come back from the
    compact form equal to what they were, and equal to the full form's trip."""
    static = static_trace([5, 6, 8], [3, 7, 4], num_slots=2)
    paged = continuous_trace([5, 6, 8], [3, 7, 4], num_slots=2)
    for i, step in enumerate(paged.steps):
        step.kv_blocks_used = 1 + i % 3
        step.block_tables = {s.request_id: list(range(i % 3 + 1)) for s in step.seqs}
        step.seqs[0].num_prefix_cached_tokens = i % 2
    paged.steps[1].shared_blocks = {0: [0, 1]}
    paged.steps[2].cached_free_blocks = [4]
    paged.info = {"kv_blocks": 9, "block_size": 4}
    paged.requests[1].sampling = SamplingParams(temperature=0.7, top_k=5, seed=3)
    paged.requests[2].num_cached_tokens = None
    paged.server_samples = [ServerSample(0.5, {"num_requests_running": 2.0})]
    vllm = captured_vllm_trace()
    vllm.warnings = ["a warning"]
    for trace in map(_round_times, (static, paged, vllm)):
        back = _compact_trip(trace)
        assert back.steps == trace.steps, f"{trace.engine}: steps changed"
        assert back.requests == trace.requests, f"{trace.engine}: requests changed"
        assert dataclasses.replace(back, steps=[], requests=[], schedule=None) == (
            dataclasses.replace(trace, steps=[], requests=[], schedule=None)
        ), f"{trace.engine}: the rest changed"
        full_trip = trace_codec.decode(trace_codec.encode(trace))
        assert trace_codec.encode(back) == trace_codec.encode(full_trip)


def test_compact_is_several_times_smaller():
    """The shipped static trace, written compact, is under a quarter of its full form."""
    data = json.loads(open(RECORDING, encoding="utf-8").read())
    trace = trace_codec.decode(data["static"])
    compact = len(json.dumps(trace_codec.encode(trace, compact=True), separators=(",", ":")))
    full = len(json.dumps(trace_codec.encode(trace), separators=(",", ":")))
    assert compact * 4 < full, f"compact {compact} bytes, full {full}"
