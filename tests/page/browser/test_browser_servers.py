"""A host with servers, in the browser: ``app.py --llamacpp``, and ``--vllm`` too where
``.venv-vllm`` is built (issue 51, item 5).

The page opens with no server ticked, so a default Run shows our engines' results without
waiting for any server, vLLM still starting beside it included. With llama.cpp ticked, our
engines' whole results (each output checked) show while llama.cpp runs, the status line naming
it, and its column follows when it finishes. One page for the module, started before the shared
server (``conftest.OWN_SERVER_MODULES``). Skipped without ``make llamacpp``'s build.
"""

from __future__ import annotations

import re

import pytest
from browser_kit import (
    PYTESTMARK,
    RUN_TIMEOUT_MS,
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

from tests.live_servers import needs_llamacpp, vllm_available

pytestmark = [*PYTESTMARK, needs_llamacpp, pytest.mark.real_model]
ROWS = [("The capital of France is", 4), ("Today's weather is so", 6)]
LONGER_ROWS = [("Once upon a time", 16), ("My favourite food is", 16)]  # llama.cpp runs seconds
START_TIMEOUT_MS = 300_000  # the F32 GGUF is converted before the page serves
PARTIAL = "our engines' results are below"  # the status line while the servers run
# Keeps, at every change of the status line or the outputs table, the status line's text, the
# table's headers and its verdict cells: what the page showed at each moment of the run.
WATCH_SHOWN_JS = """() => {
    const text = (el) => (el ? el.innerText : '').replace('⋮', '').trim();
    const shown = () => {
        const grid = document.querySelector('#outputs_table [role=grid]');
        const headers = [...document.querySelectorAll('#outputs_table thead th')]
            .map(text).filter(Boolean);
        const at = headers.indexOf('matches model.generate');
        if (!grid) return {status: '', headers, verdicts: []};  // drawn anew
        const numRows = grid.querySelectorAll('[role=gridcell][data-col="0"]').length;
        const verdicts = [...Array(numRows).keys()].map(
            (r) => text(grid.querySelector(`[data-testid="cell-${r}-${at}"]`)));
        const status = text(document.querySelector('#status_markdown [data-testid=markdown]'));
        return {status, headers, verdicts};
    };
    window.cbpShown = [];
    const keep = () => window.cbpShown.push(shown());
    for (const id of ['#status_markdown', '#outputs_table']) {
        new MutationObserver(keep).observe(document.querySelector(id),
            {subtree: true, childList: true, characterData: true});
    }
}"""


@pytest.fixture(scope="module")
def server_url(request, tmp_path_factory) -> str:
    """``app.py --llamacpp``, with ``--vllm`` (eager, 2 sequences, 256 tokens: a cheap start)
    where it is built, for this module."""
    args = ("--llamacpp",)
    if vllm_available():
        args += ("--vllm", "--vllm-eager", "--vllm-max-num-seqs", "2")
        args += ("--vllm-max-model-len", "256")
    return start_app_server(request, tmp_path_factory, args)


def test_a_default_run_waits_for_no_server(page: Page):
    """No server is ticked when the page opens, and the box says what a tick costs; a default
    Run shows our engines' results alone, vLLM still starting or not."""
    boxes = page.locator("#servers_checkbox input[type=checkbox]")
    expect(boxes).to_have_count(3 if vllm_available() else 2)
    for i in range(boxes.count()):
        expect(boxes.nth(i)).not_to_be_checked()
    label = page.locator("#servers_checkbox label").first
    expect(label).to_have_attribute("title", re.compile("everyone in line after you"))
    set_requests(page, ROWS)
    set_slots(page, 2)
    run_and_wait(page)
    status = status_text(page)
    assert "✓ all match model.generate" in status, status
    headers, _ = table(page, "outputs_table")
    servers = [h for h in headers if h.startswith(("vllm", "llamacpp"))]
    assert servers == [], f"a default Run ran servers nobody ticked: {servers}"


def test_our_results_show_while_a_ticked_server_runs(page: Page):
    """With llama.cpp ticked: while it runs, the page shows our engines' checked outputs without
    its column, the status line naming it; then its column comes."""
    line = page.locator("#servers_markdown")
    expect(line).to_contain_text("llamacpp: ready · llama.cpp", timeout=START_TIMEOUT_MS)
    tick_servers(page, ["llamacpp"])
    set_requests(page, LONGER_ROWS)
    set_slots(page, 2)
    page.evaluate(WATCH_SHOWN_JS)
    run_and_wait(page, 3 * RUN_TIMEOUT_MS)
    shown = page.evaluate("window.cbpShown")
    partial = [
        s
        for s in shown
        if PARTIAL in s["status"]
        and "llamacpp (1 of 1)" in s["status"]
        and "llamacpp output" not in s["headers"]
        and s["verdicts"] == ["✓", "✓"]
    ]
    statuses = list(dict.fromkeys(s["status"][:120] for s in shown))
    assert partial, f"our checked results never showed while llama.cpp ran: {statuses}"
    headers, rows = table(page, "outputs_table")
    assert "llamacpp output" in headers, f"llama.cpp's column never came: {headers}"
    column = headers.index("llamacpp output")
    assert all(row[column] for row in rows), f"llama.cpp's outputs are empty: {rows}"
    assert PARTIAL not in status_text(page), status_text(page)
