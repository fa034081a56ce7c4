"""vLLM's own schedule: the recording scheduler's isolation, request identity, and its record read
back as a ``Trace``, on a record captured from a real vLLM (``vllm_schedule.jsonl``, made by
``vllm_schedule_capture``) and, where marked, on the session's live vLLM."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import os
import sys
from pathlib import Path

import pytest

from engine.bench.servers import server_fields
from engine.peers.vllm_record import (
    ScheduleLog,
    external_request_id,
    our_request_id,
    parse_records,
    schedule_trace,
)
from engine.peers.vllm_server import DEFAULT_VENV, SCHEDULE_PATH_ENV, VllmServer, VllmSettings
from engine.trace import DECODE, PREFILL, Trace
from tests.captured_vllm import CAPTURED, captured_records, client_requests
from tests.live_servers import needs_vllm

ROOT = Path(__file__).resolve().parents[3]
SCHEDULER = ROOT / "engine" / "peers" / "vllm_scheduler.py"


def _imports(path: Path) -> set[str]:
    """Every module name ``path`` imports (``from x import y`` counts ``x``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_scheduler_imports_only_vllm_and_the_standard_library():
    """The recording scheduler runs in vLLM's process: it imports vllm and stdlib, nothing of
    ours (``engine``) or of our environment."""
    for name in _imports(SCHEDULER):
        top = name.split(".")[0]
        assert top in {"vllm", "__future__"} | sys.stdlib_module_names, f"it imports {name}"


def test_no_project_module_imports_the_scheduler():
    """Our environment has no vllm: no module of the project or its tests imports the scheduler
    (only vLLM loads it, by name)."""
    sources = [ROOT / "app.py", *(ROOT / "engine").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]
    for path in sources:
        names = _imports(path)
        assert "engine.peers.vllm_scheduler" not in names, f"{path} imports it"
        if "engine.peers" in names:
            text = path.read_text()
            assert "import vllm_scheduler" not in text, f"{path} imports it"


def test_the_path_variable_is_the_same_on_both_sides():
    """The server sets the record's path in the variable the scheduler reads."""
    tree = ast.parse(SCHEDULER.read_text())
    values = {
        t.id: n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
        for t in n.targets
    }
    assert values["SCHEDULE_PATH_ENV"] == SCHEDULE_PATH_ENV


def test_server_timings_vllm_with_the_recording_scheduler(tmp_path, monkeypatch):
    """By default vLLM gets ``--scheduler-cls``, this repository first on its PYTHONPATH and a
    temporary record (removed at stop); a path set here is used as it is; with recording off,
    none of them. The default environment is the repository's ``.venv-vllm``."""
    assert DEFAULT_VENV == ROOT / ".venv-vllm"
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    monkeypatch.delenv(SCHEDULE_PATH_ENV, raising=False)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    settings = VllmSettings("/models/m", "float32", 3)
    args = settings.args(8000)
    assert (
        args[args.index("--scheduler-cls") + 1] == "engine.peers.vllm_scheduler.RecordingScheduler"
    )
    server = VllmServer(settings, venv)
    env = server._schedule_env()
    assert env["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/elsewhere"]
    temporary = Path(env[SCHEDULE_PATH_ENV])
    assert temporary.exists() and server.schedule_path == temporary
    temporary.unlink()
    kept = tmp_path / "records" / "kept.jsonl"
    monkeypatch.setenv(SCHEDULE_PATH_ENV, str(kept))
    assert server._schedule_env()[SCHEDULE_PATH_ENV] == str(kept.resolve()) and kept.exists()
    off = dataclasses.replace(settings, record_schedule=False)
    assert "--scheduler-cls" not in off.args(8000)
    assert VllmServer(off, venv)._schedule_env() == {}


def test_our_id_is_found_in_vllms_request_id():
    """vLLM's id ``cmpl-<header>-<prompt>-<random>`` gives back our request id; another run's or
    client's id gives None, and R1 is never read from R12's id."""
    tag = "9f3a01bc"
    assert our_request_id(f"cmpl-{external_request_id(tag, 12)}-0-1b2c3d4e", tag) == 12
    assert our_request_id(f"cmpl-{external_request_id(tag, 1)}-0-5e6f7a8b", tag) == 1
    assert our_request_id(f"cmpl-{external_request_id(tag, 12)}-0", tag) == 12  # no suffix
    assert our_request_id(f"cmpl-{external_request_id('00000000', 12)}-0-1b2c3d4e", tag) is None
    assert our_request_id("cmpl-3c1f8e0a2b-0-77aa00ff", tag) is None


# --- the captured record ------------------------------------------------------------------------


def _captured() -> tuple[dict, list[dict]]:
    capture, records = captured_records()
    assert capture["event"] == "capture", "the captured file starts with its capture line"
    return capture, records


@pytest.fixture(scope="module")
def captured_trace() -> Trace:
    capture, records = _captured()
    return schedule_trace(
        records, client_requests(capture), capture["run_tag"], capture["t0_unix_s"]
    )


def _runs(trace: Trace) -> dict[int, list]:
    """Request id -> its scheduled shares, in step order, with their steps."""
    runs: dict[int, list] = {}
    for step in trace.steps:
        for s in step.seqs:
            runs.setdefault(s.request_id, []).append((step, s))
    return runs


def _admission_order(trace: Trace) -> list[int]:
    """Request ids in the order vLLM first scheduled them (in a step: in its schedule's order)."""
    order = [s.request_id for step in trace.steps for s in step.seqs]
    return sorted(set(order), key=order.index)


def test_capture_is_small_and_whole():
    """The committed record is a few KB and holds a start line and the run's steps."""
    capture, records = _captured()
    assert CAPTURED.stat().st_size < 20_000, "the captured record grew past 20 KB"
    assert [r["event"] for r in records[:1]] == ["start"]
    assert len(capture["requests"]) == 4


def test_every_token_is_computed_once_per_stay(captured_trace):
    """Each request's steps continue where the last left off (computed + scheduled), restart at
    the prefix-cache hit after a preemption, and end one token short of prompt + output."""
    expected: dict[int, int] = {}  # request id -> tokens computed after its last share
    for step in captured_trace.steps:
        for rid in step.preempted:
            expected[rid] = -1  # resumes from its prefix-cache hit
        for s in step.seqs:
            rid = s.request_id
            want = expected.get(rid, captured_trace.request(rid).num_cached_tokens)
            want = s.num_prefix_cached_tokens if want == -1 else want
            assert s.num_cached_tokens == want, f"R{rid} at step {step.index}"
            expected[rid] = s.num_cached_tokens + s.num_new_tokens
    for rec in captured_trace.requests:
        total = rec.num_prompt_tokens + len(rec.output_token_ids) - 1  # the last is never fed
        assert expected[rec.request_id] == total, f"R{rec.request_id} ends short"


def test_lanes_are_free_lanes_kept_until_preempted(captured_trace):
    """No two requests share a lane in a step; lanes stay below the slots; a request keeps its
    lane from admission until vLLM preempts or finishes it; R1, preempted while R2 held lane 1,
    comes back in lane 1 once R2 has finished (the first free one), not in its old lane 2."""
    lane_of: dict[int, int] = {}
    for step in captured_trace.steps:
        lanes = [s.slot for s in step.seqs]
        assert len(lanes) == len(set(lanes)), f"two requests in one lane at step {step.index}"
        assert all(0 <= lane < captured_trace.num_slots for lane in lanes)
        for rid in step.preempted:
            lane_of.pop(rid, None)
        for s in step.seqs:
            assert lane_of.setdefault(s.request_id, s.slot) == s.slot, f"R{s.request_id} moved"
    r1_lanes = [s.slot for _, s in _runs(captured_trace)[1]]
    assert sorted(set(r1_lanes), key=r1_lanes.index) == [2, 1], "R1 resumed in its old lane"


def test_block_tables_cover_the_computed_tokens(captured_trace):
    """Every scheduled request's table (vLLM's block ids) has the blocks its tokens need after the
    step; tables hold distinct blocks except shared prefix blocks, whose sharers are listed."""
    block_size = captured_trace.info["block_size"]
    for step in captured_trace.steps:
        for s in step.seqs:
            table = step.block_tables[s.request_id]
            need = math.ceil((s.num_cached_tokens + s.num_new_tokens) / block_size)
            assert len(table) == need, f"R{s.request_id} step {step.index}: {table}"
        for block, rids in step.block_holders().items():
            if len(rids) > 1:
                assert step.shared_blocks[block] == rids
        assert step.kv_blocks_used == len(step.block_holders())
        assert step.kv_blocks_used < captured_trace.info["kv_blocks"]  # block 0 is vLLM's null


def test_capture_shows_a_preemption_and_a_prefix_hit(captured_trace):
    """The capture's small KV cache preempts a request (its table dropped), and R1 starts from
    R2's two cached prompt blocks."""
    preempting = [s for s in captured_trace.steps if s.preempted]
    assert preempting, "no preemption recorded"
    for step in preempting:
        assert not set(step.preempted) & set(step.block_tables), "a preempted request holds KV"
    assert sum(r.num_preemptions for r in captured_trace.requests) == sum(
        len(s.preempted) for s in preempting
    )
    assert captured_trace.request(1).num_cached_tokens == 64
    assert any(sorted(r) == [1, 2] for s in captured_trace.steps for r in s.shared_blocks.values())


def test_kinds_and_times(captured_trace):
    """A request's first share is a prefill and its decode shares feed one token; steps run in
    time order; each request is admitted, gets its first token, then finishes."""
    for rid, shares in _runs(captured_trace).items():
        assert shares[0][1].kind == PREFILL, f"R{rid} starts with a decode"
        assert all(s.num_new_tokens == 1 for _, s in shares if s.kind == DECODE)
        rec = captured_trace.request(rid)
        assert rec.admit_s < rec.first_token_s <= rec.finish_s, f"R{rid} times out of order"
    starts = [s.start_s for s in captured_trace.steps]
    assert starts == sorted(starts) and all(s.duration_s > 0 for s in captured_trace.steps)
    assert _admission_order(captured_trace) == [3, 2, 1, 0], "not in the order they were sent"


def test_another_runs_tag_finds_nothing():
    """A record read with another run's tag yields no step: every share is someone else's."""
    capture, records = _captured()
    trace = schedule_trace(records, client_requests(capture), "00000000", capture["t0_unix_s"])
    assert trace.steps == [] and trace.info["num_foreign_seqs"] > 0


def test_bad_records_are_refused(tmp_path):
    """A line that is not JSON, or a step before any start line, raises ValueError."""
    with pytest.raises(ValueError, match="line 2 .* not JSON"):
        parse_records(['{"event": "start"}', "{not json"])
    step = {"event": "step", "preempted": [], "finished": [], "scheduled": []}
    with pytest.raises(ValueError, match="before its start line"):
        schedule_trace([step], [], "tag", 0.0)


def test_log_reads_complete_lines_after_the_mark(tmp_path):
    """``ScheduleLog`` reads the lines after its mark, after the start line they ran under, and
    leaves out a line still being written."""
    path = tmp_path / "schedule.jsonl"
    path.write_text('{"event": "start"}\n')
    log = ScheduleLog(path)
    mark = log.mark()
    with open(path, "a") as f:
        f.write('{"event": "step", "step": 0}\n{"event": "st')
    assert log.read(mark) == [{"event": "start"}, {"event": "step", "step": 0}]


def test_bench_counts_vllms_own_steps(captured_trace):
    """The bench's vllm entry takes ``num_steps`` from vLLM's record, with its recording cost."""
    client = Trace(engine="vllm", num_slots=3, wall_s=10.0, info={"server": {"url": "u"}})
    client.schedule = captured_trace
    fields = server_fields(client)
    assert fields["num_steps"] == len(captured_trace.steps) > 0
    assert fields["server"]["schedule"]["num_steps"] == fields["num_steps"]
    assert 0 < fields["server"]["schedule"]["record_cost_pct"] < 2, "recording above 2 %"
    assert "num_steps" not in server_fields(Trace(engine="vllm", num_slots=3, info=client.info))
    json.dumps(fields)


# --- the live server (tests/engine/peers/conftest.py) -------------------------------------------


@pytest.fixture(scope="module")
def reversed_run(vllm, embedded_model):
    """Three requests of distinct prompt lengths, sent in reverse order (R2 first)."""
    from engine.sequence import Request

    prompts = [tuple(range(100, 100 + n)) for n in (5, 9, 14)]
    requests = [Request(i, f"R{i}", 6, p, arrival_s=0.4 * (2 - i)) for i, p in enumerate(prompts)]
    return requests, vllm.run(requests)


@needs_vllm
@pytest.mark.real_model
def test_requests_sent_out_of_order_keep_their_ids(reversed_run):
    """Sent R2, R1, R0: vLLM's record names each one, admitted in that order, each computing its
    own prompt length (a swapped id would compute another's), and the client's view stays."""
    requests, trace = reversed_run
    schedule = trace.schedule
    assert schedule is not None, trace.warnings
    assert _admission_order(schedule) == [2, 1, 0]
    for request in requests:
        rid = request.request_id
        shares = [s for step in schedule.steps for s in step.seqs if s.request_id == rid]
        output = trace.request(rid).output_token_ids
        assert output, f"R{rid} has no output"
        last = shares[-1]
        total = request.num_prompt_tokens + len(output) - 1
        assert last.num_cached_tokens + last.num_new_tokens == total, f"R{rid} is another's"
    assert trace.steps == [] and trace.server_samples, "the client's view changed"
    assert schedule.info["num_foreign_seqs"] == 0


@needs_vllm
@pytest.mark.real_model
def test_recording_costs_under_two_percent(reversed_run):
    """The recording's time is at most 2 % of the time of the steps it records."""
    _, trace = reversed_run
    info = trace.schedule.info
    assert info["record_s"] > 0 and info["record_cost_pct"] <= 2, info
    assert server_fields(trace)["num_steps"] == len(trace.schedule.steps)


def test_the_local_vllm_is_looked_for_in_the_repositorys_venv():
    """``make vllm`` builds ``.venv-vllm`` at the repository's root, and that is where the local
    vLLM is looked for (a wrong path silently skipped every vLLM test once)."""
    from engine.peers.vllm_server import DEFAULT_VENV

    root = Path(__file__).resolve().parents[3]
    assert (root / "Makefile").is_file(), root
    assert DEFAULT_VENV == root / ".venv-vllm"


def test_a_request_sent_late_arrives_at_vllm_when_sent():
    """The client sent R1 1.5 s after its arrival (its host busy): vLLM's own view has it
    arrive at the send, so its TTFT and queue wait do not count the client's delay."""
    capture, records = _captured()
    requests = client_requests(capture)
    late = requests[1]
    late.admit_s = late.arrival_s + 1.5
    trace = schedule_trace(records, requests, capture["run_tag"], capture["t0_unix_s"])
    inside = trace.request(late.request_id)
    assert inside.arrival_s == late.arrival_s + 1.5
    on_time = trace.request(requests[0].request_id)
    assert on_time.arrival_s == requests[0].arrival_s, "a request not sent late keeps its arrival"
