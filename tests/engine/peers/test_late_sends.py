"""A client that sends requests late, or reads first tokens late (its host too busy to keep
time), says so: the TTFT from outside counts the delay."""

from engine.peers.openai_engine import late_sends
from engine.peers.vllm_engine import late_reads
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


def _read(outside: list[float], inside: list[float | None]) -> Trace:
    """A trace whose client saw first tokens at ``outside`` and whose server's own record had
    them at ``inside`` (None: not in the record)."""
    trace, schedule = _trace(*[(0.0, 0.0)] * len(outside)), _trace(*[(0.0, 0.0)] * len(inside))
    for rec, t in zip(trace.requests, outside, strict=True):
        rec.first_token_s = t
    for rec, t in zip(schedule.requests, inside, strict=True):
        rec.first_token_s = t
    trace.schedule = schedule
    return trace


def test_first_tokens_read_late_are_flagged_with_the_mean_and_the_worst():
    """Gaps 0.1, 0.9 and 0.5 s: mean 0.50 s, over the bound; the worst is R1's 0.90 s; R3 is in
    no record and counts for nothing."""
    trace = _read([1.1, 2.9, 3.5, 9.0], [1.0, 2.0, 3.0, None])
    (line,) = late_reads(trace, "vllm")
    assert "read vllm's first tokens 0.50 s after vllm's own record" in line, line
    assert "up to 0.90 s, R1" in line, line


def test_first_tokens_read_on_time_or_without_a_record_say_nothing():
    """Gaps of 0.05 and 0.15 s (mean 0.10 s) are a client's own overhead; no record, no line."""
    assert late_reads(_read([1.05, 2.15], [1.0, 2.0]), "vllm") == []
    no_record = _read([5.0], [1.0])
    no_record.schedule = None
    assert late_reads(no_record, "vllm") == []
