"""Exports: the CSV parses back, and the Perfetto file follows the trace-event format."""

import csv
import io
import itertools
import json
import os
import re

from fake_traces import continuous_trace, static_trace

from engine.workloads import export
from engine.workloads.export import CSV_FIELDS, perfetto_trace, requests_csv, traces_json

PROMPT_LENS = [5, 6, 8, 9, 10, 7]
CAPS = [6, 50, 300, 30, 180, 45]


def _traces():
    return {
        "static": static_trace(PROMPT_LENS, CAPS, num_slots=3),
        "continuous": continuous_trace(PROMPT_LENS, CAPS, num_slots=3),
    }


def test_csv_has_one_row_per_engine_and_request():
    """The CSV parses back with every field, one row per (engine, request)."""
    rows = list(csv.DictReader(io.StringIO(requests_csv(_traces()))))
    assert len(rows) == 2 * len(CAPS)
    assert set(rows[0]) == set(CSV_FIELDS)
    cont = [r for r in rows if r["engine"] == "continuous"]
    assert [int(r["num_output_tokens"]) for r in cont] == CAPS


def test_trace_json_round_trips():
    """The whole-trace JSON loads back with steps, requests and metrics per engine."""
    doc = json.loads(traces_json(_traces()))
    assert set(doc) == {"static", "continuous"}
    assert len(doc["continuous"]["steps"]) == len(_traces()["continuous"].steps)
    assert "latency_percentiles" in doc["static"]


def test_perfetto_trace_events_are_well_formed():
    """Required keys, metadata first, monotonic timestamps per track, one track per slot."""
    events = perfetto_trace(_traces())["traceEvents"]
    meta = [e for e in events if e["ph"] == "M"]
    spans = [e for e in events if e["ph"] == "X"]
    assert events[: len(meta)] == meta, "metadata events come first"
    for e in spans:
        assert {"ph", "pid", "tid", "name", "ts", "dur"} <= set(e) and e["dur"] >= 0
    slot_tracks = {(e["pid"], e["args"]["name"]) for e in meta if e["name"] == "thread_name"}
    assert {n for p, n in slot_tracks if p == 2} == {"steps", "slot 0", "slot 1", "slot 2"}
    by_track = {}
    for e in spans:
        by_track.setdefault((e["pid"], e["tid"]), []).append(e["ts"])
    assert all(ts == sorted(ts) for ts in by_track.values()), "timestamps go backwards"
    requests = [e for e in spans if e["name"].startswith("R") and e["pid"] == 2]
    assert len(requests) == len(CAPS), "one span per request"
    json.dumps(perfetto_trace(_traces()))


def test_charts_html_is_one_offline_page_with_every_chart():
    """charts.html inlines plotly.js once, draws each chart and loads nothing from the network."""
    from engine.page.figures import mask_heatmaps, timelines
    from engine.workloads.export import charts_html

    traces = _traces()
    charts = {
        "Static timeline": timelines.timeline_figure(traces["static"], "time", 10.0, 2),
        "Packed mask": mask_heatmaps.mask_heatmap(traces["continuous"], 2),
    }
    page = charts_html(charts)
    assert page.count("Plotly.newPlot(") == len(charts), "not one drawn chart per figure"
    assert page.count("window.PlotlyConfig") == 1, "plotly.js is not inlined exactly once"
    assert "cdn.plot.ly" not in page.split("window.PlotlyConfig")[0], "loads plotly from a CDN"
    assert not re.search(r'<script[^>]+src="http', page), "a script is loaded from the network"
    for heading in charts:
        assert f"<h2>{heading}</h2>" in page, f"{heading} missing"
    assert '"filename": "static-batching-3-slots"' in page, "PNG button file name not set"


def test_perfetto_shows_each_stay_of_a_preempted_request():
    """A preempted request has a span per stay in a slot and an instant event per preemption;
    spans on one slot track never overlap."""
    from tiny_model import make_requests, tiny_runner

    from engine.batching.continuous import ContinuousEngine
    from engine.config import EngineConfig

    runner = tiny_runner(seed=5)
    mib = 14 * 4 * runner.kv_bytes_per_token() / 2**20
    config = EngineConfig(4, kv_mode="paged", block_size=4, kv_budget_mib=mib)
    specs = [("the quick brown fox", 30), ("hello world", 24), ("abc", 20), ("z" * 12, 9)]
    trace = ContinuousEngine(runner, config).run(make_requests(specs))
    events = perfetto_trace({"continuous": trace})["traceEvents"]
    instants = [e for e in events if e["ph"] == "i"]
    assert len(instants) == trace.metrics().num_preemptions > 0
    victim = int(instants[0]["name"].removeprefix("preempt R"))
    stays = [e for e in events if e["ph"] == "X" and e["name"] == f"R{victim}"]
    assert len(stays) >= 2, f"R{victim} was preempted but has {len(stays)} span(s)"
    by_track = {}
    for e in (e for e in events if e["ph"] == "X" and e["name"].startswith("R")):
        by_track.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_track.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), "overlapping spans"


def test_exports_carry_a_servers_own_record():
    """traces.json holds vLLM's own record under ``schedule``; Perfetto shows it as one more
    process, ``vllm (own record)``, with a span per step and per stay in a lane, and a mark per
    preemption (from a record captured from a real vLLM)."""
    from captured_vllm import captured_vllm_trace

    vllm = captured_vllm_trace()
    doc = json.loads(traces_json({"vllm": vllm}))
    assert len(doc["vllm"]["schedule"]["steps"]) == len(vllm.schedule.steps)
    events = perfetto_trace({"continuous": _traces()["continuous"], "vllm": vllm})["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert list(names.values()) == ["continuous", "vllm", "vllm (own record)"], names
    own = next(pid for pid, name in names.items() if name == "vllm (own record)")
    steps = [e for e in events if e["pid"] == own and e["name"].startswith("step ")]
    assert len(steps) == len(vllm.schedule.steps)
    preempts = [e for e in events if e["pid"] == own and e["ph"] == "i"]
    assert len(preempts) == vllm.schedule.metrics().num_preemptions > 0
    assert {e["name"] for e in events if e["pid"] == own and e["name"].startswith("R")} == {
        f"R{r.request_id}" for r in vllm.requests
    }


def test_download_folders_keep_only_the_newest_of_their_prefix(tmp_path):
    folders = []
    for index in range(5):
        folders.append(export.download_folder("cbp-run-", root=tmp_path, keep=3))
        (folders[-1] / "requests.csv").write_text("x")
        os.utime(folders[-1], (index, index))  # mtimes 0..4 s: creation order, whatever the clock
    other = export.download_folder("cbp-table-", root=tmp_path, keep=3)
    newest = export.download_folder("cbp-run-", root=tmp_path, keep=3)
    kept = sorted(path for path in tmp_path.iterdir() if path.name.startswith("cbp-run-"))
    assert kept == sorted([*folders[3:], newest])  # the two oldest of five, then the third, went
    assert other.is_dir() and newest.is_dir() and not any(newest.iterdir())
