"""The page's host-configured servers, run by the Run handler against a real ``transformers serve``.

The page's own engines run the embedded model; the server serves the same folder, so its outputs
must equal the reference like ours. The bad cases are real too: nothing listening, a server
killed mid-stream, Stop and the time limit during a server's streams, another model.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from engine.config import EngineConfig
from engine.host_servers import server_runs, server_set
from engine.page.handlers import playground
from engine.page.run import shared_model
from engine.page.run.run_handle import RunHandle
from engine.page.run.shared_model import PageModel, local_model
from engine.page.views import run_view
from engine.peers.endpoints import Endpoint
from engine.peers.openai_engine import OpenAIEngine
from engine.serving.run_control import RunControl
from engine.worker.progress import ProgressLog
from engine.worker.worker_model import WorkerModel
from engine.workloads.workload import RequestSpec, tokenize_requests
from tests.live_servers import TransformersServe, free_port

pytestmark = pytest.mark.real_model
ROWS = [["What is 2+2? Answer with one number.", 8], ["Name one colour.", 6]]
LONG_ROWS = [["Tell me a very long story about a dragon and a knight.", 80]]
OUT = {name: i for i, name in enumerate(run_view.RUN_OUTPUTS)}


@pytest.fixture(scope="module")
def page_model(embedded_model) -> PageModel:
    return local_model(WorkerModel.from_loaded(embedded_model))


@pytest.fixture
def with_servers(page_model, monkeypatch):
    """Make ``page_model`` the page's shared model with the given server engines."""

    def attach(engines: dict) -> server_set.ServerSet:
        page_model.servers = server_set.ServerSet(engines)
        monkeypatch.setattr(shared_model, "_shared_model", page_model)
        return page_model.servers

    monkeypatch.setattr(playground, "PROGRESS_INTERVAL_S", 0.1)
    monkeypatch.setattr("engine.worker.progress.SNAPSHOT_INTERVAL_S", 0.1)
    yield attach
    page_model.servers = None


def _engine(name: str, url: str, loaded) -> OpenAIEngine:
    return OpenAIEngine(Endpoint(name, url), loaded, 2)


def _run(rows, names, handle=None, check_reference=True, on_update=None):
    """The Run handler to its end: (final outputs by name, live status lines)."""
    events = playground.run_event(
        rows, 2, True, check_reference, "paged", 0, "decode_first", False, 0, "time",
        handle=handle, server_names=names,
    )  # fmt: skip
    statuses = []
    for update in events:
        statuses.append(update[OUT["status_markdown"]])
        if on_update is not None:
            on_update(statuses[-1])
    final = dict(zip(run_view.RUN_OUTPUTS, update, strict=True))
    return final, statuses


def trace_wall(state) -> str:
    return f"{state.servers['hf_serve'].wall_s:.2f} s"


def _table(update) -> tuple[list[str], list[list]]:
    return update.value["headers"], update.value["data"]


def _verdicts(update) -> list[str]:
    """The outputs table's reference verdict per request."""
    headers, rows = _table(update)
    column = headers.index("matches model.generate")
    return [row[column] for row in rows]


def _metric(update, engine: str, header: str):
    """One engine's value in the metrics table's column ``header``."""
    column = update.value["headers"].index(header)
    return next(row[column] for row in _rows(update) if row[0] == engine)


def _rows(update) -> list[list]:
    """The metrics table's rows, from the Dataframe a Run's outputs carry."""
    return update.value["data"]


def test_server_gets_a_column_a_row_curves_lanes_and_a_chart(serve, embedded_model, with_servers):
    """A server run on the page: its outputs match the reference, and every view shows it."""
    with_servers({"hf_serve": _engine("hf_serve", serve.url, embedded_model)})
    final, statuses = _run(ROWS, ["hf_serve"])
    state, status = final["run_state"], final["status_markdown"]
    assert "✓ all match" in status and f"hf\\_serve {trace_wall(state)}" in status, status
    assert any("hf\\_serve (1 of 1): " in s for s in statuses[:-1]), "no live line for the server"
    headers, rows = _table(final["outputs_table"])
    assert "hf_serve output" in headers and _verdicts(final["outputs_table"]) == ["✓", "✓"], rows
    column = headers.index("hf_serve output")
    assert all(row[column] for row in rows), "the server's outputs are empty"
    metrics = final["metrics_table"]
    assert _metric(metrics, "hf_serve", "steps") == "—", "a server has no steps"
    assert _metric(metrics, "hf_serve", "outputs match model.generate") == "✓"
    cdf_names = {t.name for t in final["latency_cdf_plot"].data}
    assert cdf_names == {"static", "continuous", "hf_serve"}, cdf_names
    lanes = final["server_timeline_plot"]
    bars = {t.name: list(t.y) for t in lanes.data}
    assert bars == {"waiting for the first token": ["R0", "R1"], "decoding": ["R0", "R1"]}
    decoding = next(t for t in lanes.data if t.name == "decoding")
    trace = state.servers["hf_serve"]
    for r, base, width in zip(trace.requests, decoding.base, decoding.x, strict=True):
        assert base == pytest.approx(r.first_token_s) and base + width == pytest.approx(r.finish_s)
    continuous_x = final["continuous_timeline_plot"].layout.xaxis.range
    assert tuple(lanes.layout.xaxis.range) == tuple(continuous_x), "not on the same time axis"
    assert max(continuous_x) >= trace.wall_s, "the shared axis cuts the server's run off"
    chart = final["server_chart_plot"]
    assert "hf_serve: /metrics answered HTTP 404" in chart.layout.annotations[0].text


def test_our_results_show_before_the_servers_run_and_each_server_follows(
    serve, embedded_model, with_servers
):
    """Two servers ticked: the Run draws our engines' whole results (checked outputs, metrics)
    before the first server starts, then the first server's column before the second starts,
    then both, judged; the status line says which server runs (issue 51, item 5)."""
    engines = {name: _engine(name, serve.url, embedded_model) for name in ("hf_a", "hf_b")}
    with_servers(engines)
    events = playground.run_event(
        ROWS, 2, True, True, "paged", 0, "decode_first", False, 0, "time",
        server_names=["hf_a", "hf_b"],
    )  # fmt: skip
    drawn = []  # each update that drew a run: (its servers, its outputs by name)
    for update in events:
        final = dict(zip(run_view.RUN_OUTPUTS, update, strict=True))
        state = final["run_state"]
        if isinstance(state, run_view.RunState):
            drawn.append((list(state.servers), final))
    order = [servers for servers, _ in drawn]
    assert order == [[], ["hf_a"], ["hf_a", "hf_b"]], f"not ours first, then each server: {order}"
    ours = drawn[0][1]
    assert "our engines' results are below" in ours["status_markdown"], ours["status_markdown"]
    assert "hf\\_a (1 of 2): starting" in ours["status_markdown"], ours["status_markdown"]
    assert "hf\\_b (2 of 2): waiting its turn" in ours["status_markdown"]
    headers, _ = _table(ours["outputs_table"])
    assert "hf_a output" not in headers and _verdicts(ours["outputs_table"]) == ["✓", "✓"]
    assert {row[0] for row in _rows(ours["metrics_table"])} == {"static", "continuous"}
    assert "hf\\_a (1 of 2): done" in drawn[1][1]["status_markdown"]
    headers, _ = _table(drawn[1][1]["outputs_table"])
    assert "hf_a output" in headers and "hf_b output" not in headers, headers
    assert "✓ all match" in final["status_markdown"], final["status_markdown"]
    assert _verdicts(final["outputs_table"]) == ["✓", "✓"]
    assert {"hf_a", "hf_b"} <= {row[0] for row in _rows(final["metrics_table"])}


def test_unreachable_server_is_named_and_the_rest_kept(serve, embedded_model, with_servers):
    """Nothing listening: a clear message without its address; the other engines are shown."""
    gone_url = f"http://127.0.0.1:{free_port()}"
    engines = {
        "gone": _engine("gone", gone_url, embedded_model),
        "hf_serve": _engine("hf_serve", serve.url, embedded_model),
    }
    with_servers(engines)
    with pytest.warns(UserWarning, match="Cannot reach gone"):
        final, _ = _run(ROWS, ["gone", "hf_serve"])
    status = final["status_markdown"]
    assert "**✗ gone:** Cannot reach gone at (gone's address)" in status, status
    assert gone_url not in status, "the page shows a host's address"
    assert "The other engines' results are kept" in status
    assert list(final["run_state"].traces()) == ["static", "continuous", "hf_serve"]
    headers, rows = _table(final["outputs_table"])
    assert "gone output" not in headers and _verdicts(final["outputs_table"]) == ["✓", "✓"], rows


def test_server_killed_mid_run(embedded_model, with_servers):
    """A server that dies while streaming is reported; static and continuous stay."""
    doomed = TransformersServe(embedded_model.source).start()
    with_servers({"doomed": _engine("doomed", doomed.url, embedded_model)})

    def kill_once_streaming(status: str) -> None:
        if "doomed (1 of 1): 0/1 requests done, 1 streaming" in status:
            doomed.kill()

    try:
        with pytest.warns(UserWarning, match="doomed"):
            final, _ = _run(LONG_ROWS, ["doomed"], check_reference=False,
                            on_update=kill_once_streaming)  # fmt: skip
    finally:
        doomed.stop()
    status = final["status_markdown"]
    assert "**✗ doomed:**" in status and ("died" in status or "Cannot reach" in status), status
    state = final["run_state"]
    assert list(state.traces()) == ["static", "continuous"], list(state.traces())
    assert all(r.output_token_ids for r in state.continuous.requests)


def test_stop_cancels_the_server_streams_and_keeps_the_rest(serve, embedded_model, with_servers):
    """Stop while a server streams: its streams end at once; our engines' results stay."""
    with_servers({"hf_serve": _engine("hf_serve", serve.url, embedded_model)})
    handle = RunHandle()
    stopped_at = {}

    def stop_once_streaming(status: str) -> None:
        if "hf\\_serve (1 of 1): 0/1 requests done, 1 streaming" in status and not stopped_at:
            stopped_at["t"] = time.monotonic()
            handle.stop()

    final, _ = _run(LONG_ROWS, ["hf_serve"], handle, False, stop_once_streaming)
    assert stopped_at, "the server was never seen streaming"
    assert time.monotonic() - stopped_at["t"] < 10, "stopping the server's streams took too long"
    status = final["status_markdown"]
    assert "**✗ hf\\_serve:** stopped: the run was cancelled" in status, status
    assert "Its streams were cancelled" in status
    assert list(final["run_state"].traces()) == ["static", "continuous"]
    again, _ = _run([["Hi", 3]], ["hf_serve"])  # the server took the cancel and serves on
    assert "hf_serve" in again["run_state"].servers, again["status_markdown"]


def test_time_limit_cancels_a_slow_server(serve, embedded_model):
    """Past the time limit the server's streams are cancelled; the next server is not run."""
    engines = {
        "hf_serve": _engine("hf_serve", serve.url, embedded_model),
        "second": _engine("second", serve.url, embedded_model),
    }
    host = server_set.ServerSet(engines)
    requests = tokenize_requests(
        [RequestSpec(LONG_ROWS[0][0], 1500)], embedded_model.tokenizer, chat_template=True,
        max_context=embedded_model.max_context,
    )  # fmt: skip
    log = ProgressLog(RunControl(time_limit_s=2.0), lambda _entry: None)
    t0 = time.monotonic()
    traces, failures = server_runs.run_servers(
        host, ["hf_serve", "second"], requests, EngineConfig(num_slots=1), log.watch
    )
    assert time.monotonic() - t0 < 2.0 + 10, "the time limit did not cancel the streams"
    assert traces == {}
    assert failures["hf_serve"].startswith("stopped: the run took longer than the limit of 2 s")
    assert failures["second"].startswith("not run: the run took longer"), failures["second"]


def test_another_model_is_warned_and_not_compared(serve, embedded_model, with_servers):
    """A server serving another model: a warning, and its outputs are left out of the check."""
    other = dataclasses.replace(embedded_model, name="Other-1B", source="/models/other-1b")
    with_servers({"hf_serve": _engine("hf_serve", serve.url, other)})
    final, _ = _run(ROWS[:1], ["hf_serve"])
    status = final["status_markdown"]
    assert "⚠ hf\\_serve serves" in status and "cannot be compared" in status, status
    assert "✓ all match" in status, "the other engines' verdict is lost"
    verdict = _verdicts(final["outputs_table"])[0]
    assert verdict == "✓ · hf_serve: another model, not compared", verdict
    assert _metric(final["metrics_table"], "hf_serve", "outputs match model.generate") == "—"
