"""The trace's one JSON codec: ``encode`` writes a ``Trace`` as a dict, ``decode`` reads it back.
The full form (downloads) names every field; the compact form (the page's shipped recording)
writes lists of values. Format: docs/engines.md, "Core formats"."""

from __future__ import annotations

from dataclasses import asdict, fields, replace

from engine.sampling_params import SamplingParams
from engine.token_logits import LogitTrail
from engine.trace import (
    DECODE,
    IDLE,
    PREFILL,
    RequestRecord,
    ScheduledSeq,
    ServerSample,
    StepRecord,
    Trace,
)

KINDS = (PREFILL, DECODE, IDLE)
REQUEST_FIELDS = (
    "request_id",
    "prompt",
    "max_new_tokens",
    "num_prompt_tokens",
    "arrival_s",
    "slot",
    "admit_s",
    "first_token_s",
    "finish_s",
    "output_token_ids",
    "output_text",
    "finish_reason",
    "num_preemptions",
)
STEP_EXTRAS = ("shared_blocks", "cached_free_blocks", "window_freed_blocks", "group_block_tables")
SAME = 0  # in a compact step's block-tables place: the same tables as the step before
_DEFAULT_REQUEST = RequestRecord(0, "", 0, 0)


def encode(trace: Trace, compact: bool = False) -> dict:
    """``trace`` as a JSON-ready dict, full or compact (module docstring); the logit trails are
    never written. ``schedule`` (a server's own record) only when there is one."""
    head = {"engine": trace.engine, "num_slots": trace.num_slots, "kv_mode": trace.kv_mode}
    if compact:
        data = head | {"wall_s": _t(trace.wall_s), "info": trace.info}
        data |= {"requests": [_compact_request(r) for r in trace.requests]}
        data["steps"] = _compact_steps(trace.steps)
        if trace.server_samples:
            data["server_samples"] = [asdict(s) for s in trace.server_samples]
        if trace.warnings:
            data["warnings"] = list(trace.warnings)
    else:
        data = head | {"wall_s": trace.wall_s, "info": trace.info}
        data |= {
            "metrics": asdict(trace.metrics()),
            "latency_percentiles": trace.latency_percentiles(),
            "steps": [asdict(s) for s in trace.steps],
            "requests": [_request_dict(r) for r in trace.requests],
            "server_samples": [asdict(s) for s in trace.server_samples],
            "warnings": list(trace.warnings),
        }
    if trace.schedule is not None:
        data["schedule"] = encode(trace.schedule, compact)
    return data


def decode(data: dict) -> Trace:
    """The trace ``encode`` wrote, in either form, also after a trip through JSON; ``metrics`` and
    unknown keys are not read.

    Raises:
        KeyError: ``engine`` or ``num_slots`` missing (not a trace's dict).
        ValueError: a request's sampling settings are invalid.
    """
    steps, requests = data.get("steps", []), data.get("requests", [])
    compact = any(isinstance(x, list) for x in steps[:1] + requests[:1])
    schedule = data.get("schedule")
    return Trace(
        engine=data["engine"],
        num_slots=data["num_slots"],
        steps=_steps_from_compact(steps) if compact else [_step_from_dict(s) for s in steps],
        requests=[(_request_from_compact if compact else _request_from_dict)(r) for r in requests],
        wall_s=data.get("wall_s", 0.0),
        kv_mode=data.get("kv_mode"),
        info=dict(data.get("info") or {}),
        server_samples=[ServerSample(**s) for s in data.get("server_samples", [])],
        warnings=list(data.get("warnings", [])),
        schedule=None if schedule is None else decode(schedule),
    )


def _t(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _compact_steps(steps: list[StepRecord]) -> list[list]:
    rows, tables = [], None
    for s in steps:
        seqs = [_compact_seq(q) for q in s.seqs]
        changed = s.block_tables is not None and s.block_tables != tables
        row = [_t(s.start_s), _t(s.end_s), s.wave, _t(s.forward_s), s.kv_blocks_used]
        row += [s.preempted, seqs, s.block_tables if changed else SAME]
        extras = {k: getattr(s, k) for k in STEP_EXTRAS if getattr(s, k) is not None}
        rows.append(row + [extras] * bool(extras))
        tables = s.block_tables
    return rows


def _compact_seq(q: ScheduledSeq) -> list:
    row = [q.request_id, q.slot, KINDS.index(q.kind), q.num_new_tokens, q.num_cached_tokens]
    if q.num_prefix_cached_tokens:
        return row + [q.num_padding_tokens, q.num_prefix_cached_tokens]
    return row + [q.num_padding_tokens] * bool(q.num_padding_tokens)


def _compact_request(r: RequestRecord) -> list:
    row = [_t(v) if isinstance(v, float) else v for v in (getattr(r, f) for f in REQUEST_FIELDS)]
    rest = _request_dict(r)
    extras = {
        k: v
        for k, v in rest.items()
        if k not in REQUEST_FIELDS and v != getattr(_DEFAULT_REQUEST, k)
    }
    if "token_times_s" in extras:
        extras["token_times_s"] = [_t(v) for v in extras["token_times_s"]]
    return row + [extras] * bool(extras)


def _steps_from_compact(rows: list[list]) -> list[StepRecord]:
    steps, tables = [], None
    for index, row in enumerate(rows):
        start_s, end_s, wave, forward_s, blocks_used, preempted, seqs, raw_tables, *extras = row
        if raw_tables != SAME:
            tables = _int_keys(raw_tables)
        scheduled = [
            ScheduledSeq(rid, slot, KINDS[kind], new, cached, *rest)
            for rid, slot, kind, new, cached, *rest in seqs
        ]
        step = StepRecord(index, start_s, end_s, scheduled, wave, forward_s, list(preempted))
        step.kv_blocks_used = blocks_used
        step.block_tables = None if tables is None else {k: list(v) for k, v in tables.items()}
        for name, value in (extras[0] if extras else {}).items():
            setattr(step, name, _int_keys(value) if name == "shared_blocks" else list(value))
        _group_int_keys(step)
        steps.append(step)
    return steps


def _request_from_compact(row: list) -> RequestRecord:
    values = dict(zip(REQUEST_FIELDS, row[: len(REQUEST_FIELDS)], strict=True))
    extras = row[len(REQUEST_FIELDS) :]
    return _request_from_dict(values | (extras[0] if extras else {}))


def _known(cls, data: dict) -> dict:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _int_keys(mapping: dict | None) -> dict | None:
    """``{"3": v}`` (JSON) or ``{3: v}`` -> ``{3: list(v)}``; None stays None."""
    return None if mapping is None else {int(k): list(v) for k, v in mapping.items()}


def _step_from_dict(data: dict) -> StepRecord:
    step = StepRecord(**_known(StepRecord, data))
    step.seqs = [ScheduledSeq(**_known(ScheduledSeq, s)) for s in step.seqs]
    step.preempted = list(step.preempted)
    step.block_tables = _int_keys(step.block_tables)
    step.shared_blocks = _int_keys(step.shared_blocks)
    _group_int_keys(step)
    return step


def _group_int_keys(step: StepRecord) -> None:
    if step.group_block_tables is not None:
        step.group_block_tables = [_int_keys(tables) for tables in step.group_block_tables]


def _request_from_dict(data: dict) -> RequestRecord:
    record = RequestRecord(**_known(RequestRecord, data))
    if record.sampling is not None:
        record.sampling = SamplingParams(**record.sampling)
    return record


def _request_dict(record: RequestRecord) -> dict:
    """``asdict(record)`` without the logit trail (bulky, and not JSON)."""
    values = asdict(replace(record, token_logits=LogitTrail()))
    del values["token_logits"]
    return values
