"""Hand-built traces for figure and handler tests: what the engines would record, without a model.

Each step lasts ``STEP_S`` seconds; request ``r`` generates tokens ``100 * r + k`` (k = 0, 1, ...).
"""

from __future__ import annotations

from engine.trace import DECODE, IDLE, PREFILL, RequestRecord, ScheduledSeq, StepRecord, Trace

STEP_S = 0.1


def _records(prompt_lens: list[int], caps: list[int]) -> list[RequestRecord]:
    return [
        RequestRecord(request_id=i, prompt=f"prompt {i}", max_new_tokens=cap, num_prompt_tokens=n)
        for i, (n, cap) in enumerate(zip(prompt_lens, caps, strict=True))
    ]


def _emit(record: RequestRecord, pos: int) -> None:
    """Record one generated token for a request at step position ``pos``."""
    if not record.output_token_ids:
        record.first_token_s = (pos + 1) * STEP_S
    record.output_token_ids.append(100 * record.request_id + len(record.output_token_ids))
    record.output_text = " ".join(map(str, record.output_token_ids))
    if len(record.output_token_ids) == record.max_new_tokens:
        record.finish_s, record.finish_reason = (pos + 1) * STEP_S, "length"


def continuous_trace(prompt_lens: list[int], caps: list[int], num_slots: int) -> Trace:
    """A continuous run: a finished slot is refilled on the next step, prefill fused with decode."""
    trace = Trace(engine="continuous", num_slots=num_slots, requests=_records(prompt_lens, caps))
    waiting, running = list(range(len(caps))), {}  # running: slot -> request id
    while waiting or running:
        for slot in range(num_slots):
            if slot not in running and waiting:
                running[slot] = waiting.pop(0)
        pos, seqs = len(trace.steps), []
        for slot, rid in sorted(running.items()):
            r = trace.requests[rid]
            if not r.output_token_ids:
                r.slot, r.admit_s = slot, pos * STEP_S
                seqs.append(ScheduledSeq(rid, slot, PREFILL, r.num_prompt_tokens, 0))
            else:
                cached = r.num_prompt_tokens + len(r.output_token_ids) - 1
                seqs.append(ScheduledSeq(rid, slot, DECODE, 1, cached))
            _emit(r, pos)
        trace.steps.append(StepRecord(pos, pos * STEP_S, (pos + 1) * STEP_S, seqs))
        running = {s: rid for s, rid in running.items() if trace.requests[rid].finish_s is None}
    trace.wall_s = len(trace.steps) * STEP_S
    return trace


def static_trace(prompt_lens: list[int], caps: list[int], num_slots: int) -> Trace:
    """A static run: left-padded waves of ``num_slots`` rows, each run to its longest cap."""
    trace = Trace(engine="static", num_slots=num_slots, requests=_records(prompt_lens, caps))
    for wave, start in enumerate(range(0, len(caps), num_slots)):
        rids = list(range(start, min(start + num_slots, len(caps))))
        width = max(prompt_lens[r] for r in rids)
        for k in range(max(caps[r] for r in rids)):
            pos, seqs = len(trace.steps), []
            for slot, rid in enumerate(rids):
                r = trace.requests[rid]
                pad = width - r.num_prompt_tokens
                if k == 0:
                    r.slot, r.admit_s = slot, pos * STEP_S
                    seqs.append(ScheduledSeq(rid, slot, PREFILL, r.num_prompt_tokens, 0, pad))
                    _emit(r, pos)
                elif r.finish_s is None:
                    cached = r.num_prompt_tokens + k - 1
                    seqs.append(ScheduledSeq(rid, slot, DECODE, 1, cached, 0))
                    _emit(r, pos)
                else:
                    seqs.append(ScheduledSeq(rid, slot, IDLE, 1, r.num_prompt_tokens + k - 1, 0))
            trace.steps.append(StepRecord(pos, pos * STEP_S, (pos + 1) * STEP_S, seqs, wave))
    trace.wall_s = len(trace.steps) * STEP_S
    return trace
