"""llama.cpp on the page (``app.py --llamacpp``), run by the Run handler against a real
``llama-server``: both engines configured, fitted to each run's slots and longest request, judged
against the reference (the Q4_1 engine's splits labelled, never a failure), and a server killed
mid-run reported while the other engines' results stay. Skipped without ``make llamacpp``'s
build (``needs_llamacpp``)."""

from __future__ import annotations

import re

import pytest

from engine.host_servers import server_choice
from engine.host_servers.server_choice import ServerChoice
from engine.page.handlers import playground
from engine.page.host import launch
from engine.page.run import shared_model
from engine.page.run.shared_model import local_model
from engine.page.views import divergence_view, run_view, server_view, tables
from engine.worker.worker_model import WorkerModel
from tests.live_servers import needs_llamacpp

pytestmark = [needs_llamacpp, pytest.mark.real_model]
NAMES = ["llamacpp", "llamacpp_q4"]
ROWS = [["The capital of France is", 10], ["Water boils at", 14], ["One, two,", 12]]
LONG_ROWS = [["1, 2, 3, 4, 5, 6, 7, 8,", 400]]  # counts on for seconds on llama.cpp


@pytest.fixture(scope="module")
def page_servers(embedded_model):
    """The embedded model as the page's, with ``--llamacpp``'s servers started (module-wide)."""
    model = local_model(WorkerModel.from_loaded(embedded_model))
    model.servers = server_choice.build(embedded_model, ServerChoice(llamacpp=True)).start()
    yield model
    model.servers.close()


@pytest.fixture
def page(page_servers, monkeypatch):
    """``page_servers`` as the page's model, its progress seen every 0.1 s."""
    monkeypatch.setattr(shared_model, "_shared_model", page_servers)
    monkeypatch.setattr(playground, "PROGRESS_INTERVAL_S", 0.1)
    monkeypatch.setattr("engine.worker.progress.SNAPSHOT_INTERVAL_S", 0.1)
    return page_servers


def _run(rows, num_slots: int, names, on_update=None, check_reference=True) -> dict:
    events = playground.run_event(
        rows, num_slots, True, check_reference, "paged", 0, "decode_first", False, 0, "time",
        server_names=names,
    )  # fmt: skip
    for update in events:
        if on_update is not None:
            on_update(update[run_view.RUN_OUTPUTS.index("status_markdown")])
    return dict(zip(run_view.RUN_OUTPUTS, update, strict=True))


def test_flag_configures_both_engines():
    """``--llamacpp`` is a flag of app.py; it reaches the servers' configuration."""
    assert launch.parse_args(["--llamacpp"]).llamacpp is True
    assert launch.parse_args([]).llamacpp is False


def test_both_engines_fit_the_run_and_get_verdicts(page):
    """A run with both: each gets the run's slots and a context per slot of its longest request,
    a column, lanes, a verdict per request; F32 all ✓ or ≈, Q4_1 splits as ≠ with the label."""
    final = _run(ROWS, 2, NAMES)
    state = final["run_state"]
    assert list(state.servers) == NAMES, (state.server_failures, final["status_markdown"])
    longest = max(r.num_prompt_tokens + r.max_new_tokens for r in state.continuous.requests)
    for name in NAMES:
        settings = page.servers.engines[name].server.settings
        assert (settings.num_slots, settings.ctx_per_slot) == (2, longest), settings
        assert state.servers[name].num_slots == 2
        assert set(state.verdicts[name]) == {0, 1, 2}, f"{name} not judged: {state.verdicts}"
    f32_trace = state.servers["llamacpp"]
    padded = -(-longest // 256) * 256  # llama.cpp rounds each slot's context up to 256 tokens
    assert f32_trace.info["server"]["settings"]["props"] == {"total_slots": 2, "n_ctx": padded}
    assert f32_trace.info["server"]["kv_pool"]["gauge"] == "llamacpp /slots", f32_trace.info
    kv = [s.values.get("kv_cache_usage_pct") for s in f32_trace.server_samples]
    assert any(v for v in kv), f"no KV use from /slots in {f32_trace.server_samples}"
    f32 = state.verdicts["llamacpp"]
    assert divergence_view.counts(f32)[2] == 0, f"F32 output not explained: {f32}"
    for entry in state.verdicts["llamacpp_q4"].values():
        assert entry["verdict"] in ("match", divergence_view.EXPECTED), entry
        if entry["verdict"] != "match":
            assert "quantized weights: differences expected" in entry["label"], entry
    status = final["status_markdown"]
    assert "**✗" not in status and not re.search(r"[1-9]\d* ✗", status), f"a failure: {status}"
    assert "llamacpp_q4" in status and "llamacpp " in status, status
    headers = final["outputs_table"].value["headers"]
    assert {"llamacpp output", "llamacpp_q4 output"} <= set(headers), headers
    lanes = final["server_timeline_plot"]
    assert lanes is not None and {"R0", "R1", "R2"} <= {y for d in lanes.data for y in d.y}
    line = server_view.servers_markdown(page.servers)
    assert "**llamacpp**: ready · llama.cpp" in line and "F32 weights · 2 slots" in line, line


def test_other_slots_restart_the_server(page):
    """A run with other slots starts llama.cpp again with ``--parallel`` = those slots."""
    _run(ROWS[:1], 1, ["llamacpp"])
    engine = page.servers.engines["llamacpp"]
    assert engine.server.settings.num_slots == 1 and engine.server.running


def test_server_killed_mid_run_is_reported_and_the_rest_kept(page):
    """llama-server killed while it streams: ✗ with why; our engines' results stay; the next
    run starts it again."""
    engine = page.servers.engines["llamacpp_q4"]

    def kill_once_streaming(status: str) -> None:
        if "0/1 requests done, 1 streaming" in status and engine.server.running:
            engine.server.kill()

    with pytest.warns(UserWarning, match="llama-server exited with code -9"):
        final = _run(LONG_ROWS, 1, ["llamacpp_q4"], kill_once_streaming, check_reference=False)
    status = final["status_markdown"]
    assert "**✗ llamacpp\\_q4:** llama-server exited with code -9 during a run" in status, status
    assert "The other engines' results are kept." in status, status
    assert list(final["run_state"].traces()) == ["static", "continuous"]
    again = _run(ROWS[:1], 1, ["llamacpp_q4"])["run_state"]
    assert list(again.servers) == ["llamacpp_q4"], again.server_failures
    assert tables.compared(again.servers["llamacpp_q4"])
