"""A host's endpoint with a record (``--endpoint-record``) on the page: a vLLM started as a user
would, serving its record over HTTP, drawn from the inside like the local vLLM, its record
address never shown."""

from __future__ import annotations

import html
import json

import pytest

from engine.host_servers import server_choice
from engine.host_servers.server_choice import ServerChoice
from engine.page.handlers import playground
from engine.page.run import shared_model
from engine.page.run.shared_model import local_model
from engine.page.views import run_view
from engine.worker.worker_model import WorkerModel
from tests.live_servers import UserVllm, needs_vllm

pytestmark = [needs_vllm, pytest.mark.real_model]
ROWS = [["What is 2+2? Answer with one number.", 8], ["Name one colour.", 6]]
OUT = {name: i for i, name in enumerate(run_view.RUN_OUTPUTS)}


@pytest.fixture(scope="module")
def user_vllm(embedded_model):
    """One vLLM for this module, started as a user would; stopped after it."""
    server = UserVllm(embedded_model.source).start()
    yield server
    server.stop()


def test_a_recorded_endpoint_is_drawn_from_the_inside(user_vllm, embedded_model, monkeypatch):
    """Its run carries the server's own steps, the inside views draw them under its name, and no
    view or message shows its URL or its record address."""
    monkeypatch.delenv("CBP_VLLM_RECORD_TOKEN", raising=False)
    page_model = local_model(WorkerModel.from_loaded(embedded_model))
    page_model.servers = server_choice.build(
        embedded_model,
        ServerChoice(
            endpoint=(f"gpu={user_vllm.url}",), endpoint_record=(f"gpu={user_vllm.record_url}",)
        ),
        environ={},
    )
    monkeypatch.setattr(shared_model, "_shared_model", page_model)
    events = playground.run_event(
        ROWS, 2, True, True, "paged", 0, "decode_first", False, 0, "time", server_names=["gpu"]
    )
    final = dict(zip(run_view.RUN_OUTPUTS, list(events)[-1], strict=True))
    trace = final["run_state"].servers["gpu"]
    assert trace.schedule is not None and len(trace.schedule.steps) >= 6, trace.warnings
    timeline = final["inside_timeline_plot"]
    assert timeline is not None and timeline.data, "no inside timeline for the endpoint"
    drawn = html.unescape(json.dumps(timeline.to_plotly_json()))
    assert "From gpu's own record" in drawn, timeline.layout.title
    shown = json.dumps([trace.warnings, trace.info], default=str)  # as traces.json gives them
    shown += str(final["status_markdown"])
    for address in (user_vllm.url, user_vllm.record_url):
        assert address not in shown, f"{address} shown on the page"
