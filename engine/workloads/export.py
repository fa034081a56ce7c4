"""Exports: a run's data for spreadsheets (``requests_csv``), scripts (``traces_json``), Perfetto
(``perfetto_trace``) and an offline browser (``charts_html``)."""

from __future__ import annotations

import csv
import html
import io
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from engine import trace_codec
from engine.sampling_params import FIELDS as SAMPLING_FIELDS
from engine.trace import Trace

DOWNLOAD_ROOT = Path(tempfile.gettempdir()) / "cbp-downloads"
KEPT_DOWNLOADS = 32  # folders per prefix: Gradio copies a handler's files into its own cache

CSV_FIELDS = [
    "engine",
    "request_id",
    "prompt",
    "max_new_tokens",
    "num_prompt_tokens",
    "num_output_tokens",
    "slot",
    "arrival_s",
    "queue_s",
    "ttft_s",
    "tpot_s",
    "latency_s",
    "finish_reason",
    "output_text",
    "num_cached_tokens",  # prompt tokens from the prefix cache (added last: old readers go on)
    *SAMPLING_FIELDS,  # temperature, top_k, top_p, seed: blank for a greedy request (added last)
]
STEPS_TID = 0  # the steps track; slot s is track s + 1


def requests_csv(traces: dict[str, Trace]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS)
    writer.writeheader()
    for name, trace in traces.items():
        for r in trace.requests:
            row = {f: getattr(r, f, None) for f in CSV_FIELDS if f not in SAMPLING_FIELDS}
            row |= r.sampling.to_dict() if r.sampling is not None else {}
            row.update(engine=name, num_output_tokens=len(r.output_token_ids))
            writer.writerow(row)
    return out.getvalue()


def traces_json(traces: dict[str, Trace]) -> str:
    """Every trace, whole, as one JSON document ``{engine: trace_codec.encode(trace)}``."""
    return json.dumps({name: trace_codec.encode(t) for name, t in traces.items()}, indent=1)


def perfetto_trace(traces: dict[str, Trace]) -> dict:
    """Chrome trace-event JSON: per engine a process, per slot a track, a span per stay in a slot (a
    preemption: an instant on the "steps" track); ``ts``, ``dur``: µs since each run started.
    Format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU"""
    events = []
    for pid, (name, trace) in enumerate(_with_own_records(traces).items(), start=1):
        events += _track_names(pid, name, trace)
        events += [
            _span(pid, STEPS_TID, f"step {s.index}", s.start_s, s.end_s, _step_args(trace, s))
            for s in trace.steps
        ]
        events += [_run_span(pid, trace, run) for run in trace.slot_runs()]
        events += [
            _instant(pid, f"preempt R{rid}", step.start_s)
            for step in trace.steps
            for rid in step.preempted
        ]
    events.sort(key=lambda e: (e["ph"] != "M", e.get("ts", 0)))
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _with_own_records(traces: dict[str, Trace]) -> dict[str, Trace]:
    """The traces, each server's ``Trace.schedule`` right after it as ``"<name> (own record)"``."""
    found = {}
    for name, trace in traces.items():
        found[name] = trace
        if trace.schedule is not None:
            found[f"{name} (own record)"] = trace.schedule
    return found


def _run_span(pid: int, trace: Trace, run) -> dict:
    r = trace.request(run.request_id)
    args = {
        "prompt": r.prompt,
        "max_new_tokens": r.max_new_tokens,
        "output_tokens": len(r.output_token_ids),
        "ttft_s": r.ttft_s,
        "num_cached_tokens": r.num_cached_tokens,
        "steps": [run.first, run.last],
    }
    start_s, end_s = trace.steps[run.first].start_s, trace.steps[run.last].end_s
    name = f"R{r.request_id}" + (" idle (padding)" if run.idle else "")
    return _span(pid, run.slot + 1, name, start_s, end_s, args)


def _instant(pid: int, name: str, at_s: float) -> dict:
    ts = round(at_s * 1e6, 1)
    return {"ph": "i", "s": "t", "pid": pid, "tid": STEPS_TID, "name": name, "ts": ts}


def _track_names(pid: int, name: str, trace: Trace) -> list[dict]:
    tracks = {STEPS_TID: "steps"} | {slot + 1: f"slot {slot}" for slot in range(trace.num_slots)}
    threads = [
        {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": track}}
        for tid, track in tracks.items()
    ]
    return [{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}}, *threads]


def _span(pid: int, tid: int, name: str, start_s: float, end_s: float, args: dict) -> dict:
    return {
        "ph": "X",
        "pid": pid,
        "tid": tid,
        "name": name,
        "ts": round(start_s * 1e6, 1),
        "dur": round(max(0.0, end_s - start_s) * 1e6, 1),
        "args": args,
    }


def _step_args(trace: Trace, step) -> dict:
    args = {
        "num_tokens": step.num_scheduled_tokens,
        "num_seqs": len(step.seqs),
        "prefill": [s.request_id for s in step.seqs if s.kind == "prefill"],
    }
    if trace.info.get("token_budget") is not None:
        args["token_budget"] = trace.info["token_budget"]
    if step.kv_blocks_used is not None:
        args["kv_blocks_used"] = step.kv_blocks_used
    if step.shared_blocks is not None:
        args["kv_blocks_shared"] = len(step.shared_blocks)
        args["kv_blocks_cached_free"] = len(step.cached_free_blocks or [])
    return args


def charts_html(charts: dict[str, Any]) -> str:
    """One standalone HTML page with every chart (heading -> plotly figure); plotly.js is inlined
    once (about 4.6 MB), so it opens without a network."""
    parts = []
    for i, (heading, fig) in enumerate(charts.items()):
        config = fig.plotly_config() if hasattr(fig, "plotly_config") else {}
        div = fig.to_html(full_html=False, include_plotlyjs=i == 0, config=config)
        parts.append(f"<h2>{html.escape(heading)}</h2>\n{div}")
    body = "\n".join(parts)
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        "<title>Continuous Batching Playground charts</title>"
        "<style>body{font-family:sans-serif;margin:2em}</style></head>"
        f"<body>\n{body}\n</body></html>\n"
    )


def write_files(folder: str | Path, traces: dict[str, Trace]) -> list[Path]:
    files = {
        "requests.csv": requests_csv(traces),
        "traces.json": traces_json(traces),
        "trace.perfetto.json": json.dumps(perfetto_trace(traces)),
    }
    return write_texts(folder, files)


def write_texts(folder: str | Path, files: dict[str, str]) -> list[Path]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return [folder / name for name in files]


def download_folder(prefix: str, root: Path = DOWNLOAD_ROOT, keep: int = KEPT_DOWNLOADS) -> Path:
    """A fresh folder under ``root`` named ``prefix`` and a random tail; beyond the newest ``keep``
    of that prefix the oldest are removed (Gradio serves returned files from its own copies)."""
    root.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    older = sorted(root.glob(f"{prefix}*"), key=lambda path: path.stat().st_mtime)
    for path in older[: max(len(older) - keep, 0)]:
        if path != folder:
            shutil.rmtree(path, ignore_errors=True)
    return folder
