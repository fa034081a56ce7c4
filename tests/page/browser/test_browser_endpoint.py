"""A vLLM deployment of one's own on the page, in the browser: drawn from the inside as an endpoint.

A vLLM started as a user would (``tests.live_servers.UserVllm``: the recording scheduler named on
its command line, its record served over HTTP at ``CBP_VLLM_RECORD_ADDRESS``), given to
``app.py`` as ``--endpoint myvllm=URL --endpoint-record myvllm=RECORD_URL``, never through the
page's ``--vllm``. A run with it ticked gives its outputs column, checked, and its own record of
its steps in the inside views, which the step slider walks. One run, one page of its own (started
before the shared server, as vLLM's). Skipped without ``.venv-vllm`` (``make vllm``).
"""

from __future__ import annotations

import re

import pytest
from browser_kit import (
    PYTESTMARK,
    SCREENSHOTS,
    Page,
    expect,
    run_and_wait,
    set_requests,
    set_slots,
    status_text,
    table,
    tick_servers,
)
from server_kit import start_app_server

from tests.live_servers import UserVllm, needs_vllm

pytestmark = [*PYTESTMARK, needs_vllm, pytest.mark.real_model]
NAME = "myvllm"
ROWS = [("The capital of France is", 6), ("1, 2, 3,", 4)]
READY_TIMEOUT_MS = 120_000  # the page asks a server that is up already what it serves


@pytest.fixture(scope="module")
def user_vllm(embedded_model):
    """vLLM started as a user would, for this module; stopped after it."""
    server = UserVllm(embedded_model.source).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def server_url(request, tmp_path_factory, user_vllm) -> str:
    """``app.py`` given that vLLM as an endpoint with its record, for this module."""
    args = ("--endpoint", f"{NAME}={user_vllm.url}")
    args += ("--endpoint-record", f"{NAME}={user_vllm.record_url}")
    return start_app_server(request, tmp_path_factory, args)


def test_endpoint_with_a_record_is_drawn_from_the_inside(page: Page):
    """The endpoint's column is checked against model.generate; the inside views come from its
    own record: the slider names its steps, and its first step's packed mask holds both prompts
    where its last holds one decode."""
    line = page.locator("#servers_markdown")
    expect(line).to_contain_text(f"{NAME}: ready", timeout=READY_TIMEOUT_MS)
    tick_servers(page, [NAME])
    set_requests(page, ROWS)
    set_slots(page, 3)  # the deployment's --max-num-seqs
    run_and_wait(page)
    status = status_text(page)
    assert f" · {NAME} " in status and "✗" not in status, status
    headers, rows = table(page, "outputs_table")
    column, verdict = headers.index(f"{NAME} output"), headers.index("matches model.generate")
    for row in rows:
        assert row[column] and row[verdict] == "✓", f"{NAME}'s output not shown or checked: {row}"
    expect(page.locator("#inside_markdown")).to_contain_text("From the inside")
    label = page.locator("#step_slider").inner_text()
    found = re.search(rf"{NAME} 0–(\d+) \(its own record\)", label)
    assert found, f"the step slider does not name {NAME}'s steps: {label!r}"
    queries = [_mask_queries(page, step) for step in (0, int(found.group(1)))]
    assert queries[0] > queries[1] == 1, f"{NAME}'s mask: {queries[0]} then {queries[1]} queries"
    page.locator("#inside_markdown").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "endpoint-inside.png"), full_page=True)


def _mask_queries(page: Page, step: int) -> int:
    """Type ``step`` into the step slider's box; the endpoint's packed mask's query rows."""
    box = page.locator("#step_slider input[type=number]")
    box.fill(str(step))
    box.press("Enter")
    title = page.locator("#inside_mask_plot .gtitle")
    expect(title).to_contain_text(f"{NAME} from the inside · Packed step {step}:")
    return page.locator("#inside_mask_plot .js-plotly-plot").evaluate("el => el.data[0].y.length")
