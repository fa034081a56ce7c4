"""A client that sends requests late (its host too busy to keep time) says so: the TTFT from
outside counts the delay."""

from engine.peers.openai_engine import late_sends
from engine.trace import RequestRecord, Trace


def _trace(*sent: tuple[float, float | None]) -> Trace:
    trace = Trace(engine="vllm", num_slots=3)
    trace.requests = [
        RequestRecord(i, f"R{i}", 5, 3, arrival_s=arrival, admit_s=admit)
        for i, (arrival, admit) in enumerate(sent)
    ]
    return trace


def test_late_sends_are_counted_with_the_worst_named():
    (line,) = late_sends(_trace((0.0, 0.01), (0.8, 1.61), (1.0, 1.61), (2.0, None)), "vllm")
    assert "sent 2 requests to vllm late, up to 0.81 s after arrival (R1;" in line, line


def test_sends_within_the_bound_say_nothing():
    assert late_sends(_trace((0.0, 0.05), (0.8, 1.25), (1.0, None)), "vllm") == []
