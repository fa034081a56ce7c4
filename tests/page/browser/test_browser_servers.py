"""A host with servers, in the browser: ``app.py --llamacpp``, and ``--vllm`` too where
``.venv-vllm`` is built (issue 51, items 1, 3 and 5).

The page opens with no server ticked, so a default Run shows our engines' results without
waiting for any server, vLLM still starting beside it included. With llama.cpp ticked, our
engines' whole results (each output checked) show while llama.cpp runs, the status line naming
it, and its column follows when it finishes. On a host kept busy (``busy_host``), with every
server ticked, the same holds, the status line marks each engine's result taken under load, and
two people who press Run behind that run wait with their place, are never dropped, and get
their own results. One page for the module, started before the shared server
(``conftest.OWN_SERVER_MODULES``). Skipped without ``make llamacpp``'s build.
"""

from __future__ import annotations

import re
import time

import pytest
from browser_kit import (
    PYTESTMARK,
    RUN_TIMEOUT_MS,
    WATCH_NOTE_JS,
    Page,
    assert_results,
    expect,
    open_session,
    run_and_wait,
    set_requests,
    set_slots,
    status_text,
    table,
    tick_servers,
    wait_for_run_end,
)
from server_kit import start_app_server

from tests.busy_host import busy_host
from tests.live_servers import needs_llamacpp, vllm_available

pytestmark = [*PYTESTMARK, needs_llamacpp, pytest.mark.real_model]
ROWS = [("The capital of France is", 4), ("Today's weather is so", 6)]
LONGER_ROWS = [("Once upon a time", 16), ("My favourite food is", 16)]  # llama.cpp runs seconds
START_TIMEOUT_MS = 300_000  # the F32 GGUF is converted before the page serves
VLLM_START_TIMEOUT_MS = 1_200_000  # eager start on a busy 2-core CPU: about 2 minutes idle
BUSY_RUN_TIMEOUT_MS = 600_000  # every engine at about half its CPUs' speed
# On the busy host: the first person's run, with every server ticked, then two people's runs
# pressed behind it, each a setup no other test runs (an identical one would be shown, not run).
BUSY_ROWS = [("A busy host still answers", 10), ("Servers follow our engines", 10)]
QUEUED_ROWS = [
    [("Waiting in line for", 3), ("the model to be free", 4)],
    [("Third in line and", 4), ("still kept in it", 3)],
]
WAITING = re.compile(r"Waiting for the model: place (\d+) of (\d+)")
DROPPED = re.compile(r"left the queue|Stopped before it started")  # said only after Stop
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


def test_people_in_line_behind_a_run_with_servers_on_a_busy_host(page: Page, browser, server_url):
    """On a host kept busy, a run with every server ticked shows our checked results while they
    run and marks each engine's result taken under load; two people who press Run behind it
    wait with their place, are never dropped, and get their own full results."""
    names = _tick_ready_servers(page)
    _set_up(page, BUSY_ROWS)
    behind = [open_session(browser, server_url) for _ in QUEUED_ROWS]
    try:
        for tab, rows in zip(behind, QUEUED_ROWS, strict=True):
            _set_up(tab, rows)
        with busy_host():
            page.evaluate(WATCH_SHOWN_JS)
            page.evaluate(WATCH_NOTE_JS)
            page.locator("#run_button").click()
            pressed_s = time.monotonic()
            expect(page.locator("#run_note_markdown")).to_contain_text("Running:", timeout=120_000)
            for tab in behind:  # both at once, so that both wait while the first run goes
                tab.evaluate(WATCH_NOTE_JS)
                tab.locator("#run_button").click()
            for tab in (page, *behind):
                wait_for_run_end(tab, BUSY_RUN_TIMEOUT_MS)
                print(f"a run ended {time.monotonic() - pressed_s:.1f} s after the first Run")
        _assert_ours_shown_before_the_servers(page, names)
        _assert_marked_taken_under_load(status_text(page), ["static", "continuous", *names])
        places = [
            _assert_kept_in_line(tab, rows) for tab, rows in zip(behind, QUEUED_ROWS, strict=True)
        ]
        print("places told (place, total), by the second and third:", places)
        assert any(total == 3 for told in places for _, total in told), (
            f"the two never waited in line together behind the first run: places told {places}"
        )
    finally:
        for tab in behind:
            tab.context.close()


def _tick_ready_servers(page: Page) -> list[str]:
    """Wait until llama.cpp, and vLLM where the module started one, are ready; tick them."""
    names = ["llamacpp", *(["vllm"] if vllm_available() else [])]
    line = page.locator("#servers_markdown")
    expect(line).to_contain_text("llamacpp: ready · llama.cpp", timeout=START_TIMEOUT_MS)
    if "vllm" in names:
        expect(line).to_contain_text("vllm: ready · vLLM", timeout=VLLM_START_TIMEOUT_MS)
    tick_servers(page, names)
    return names


def _set_up(page: Page, rows: list[tuple[str, int]]) -> None:
    set_requests(page, rows)
    set_slots(page, 2)


def _assert_ours_shown_before_the_servers(page: Page, names: list[str]) -> None:
    """Our engines' checked outputs showed before any server's column; then every column came."""
    columns = [f"{name} output" for name in names]
    shown = page.evaluate("window.cbpShown")
    early = [
        s
        for s in shown
        if PARTIAL in s["status"]
        and not any(c in s["headers"] for c in columns)
        and s["verdicts"] == ["✓", "✓"]
    ]
    statuses = list(dict.fromkeys(s["status"][:120] for s in shown))
    assert early, f"our checked results never showed while the servers ran: {statuses}"
    headers, rows = table(page, "outputs_table")
    for column in columns:
        assert column in headers, f"{column!r} never came: {headers}"
        assert all(row[headers.index(column)] for row in rows), f"{column} is empty: {rows}"


def _assert_marked_taken_under_load(status: str, names: list[str]) -> None:
    for name in names:
        marked = f"⚠ {name} ran while other work took"
        assert marked in status, f"{name}'s result is not marked as taken under load: {status}"
    assert "taken under load" in status, status


def _assert_kept_in_line(page: Page, rows: list[tuple[str, int]]) -> list[tuple[int, int]]:
    """A person who pressed Run behind the busy run waited, was never dropped and got their own
    result; the places (place, total) the note under Run told them."""
    notes = page.evaluate("window.cbpNotes")
    dropped = [note for note in notes if DROPPED.search(note)]
    assert not dropped, f"dropped from the queue without pressing Stop: {notes}"
    told = [tuple(map(int, m.groups())) for note in notes if (m := WAITING.search(note))]
    assert told, f"never waited in the queue: {notes}"
    status = status_text(page)
    assert not status.startswith("Shown at once"), f"shown another run, not its own: {status}"
    assert_results(page, [prompt for prompt, _ in rows])
    return told
