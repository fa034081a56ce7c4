"""Shared pieces of the browser tests: Chromium's flags, the page's element ids, table helpers.

The page runs in a real headless Chromium (Debian's ``/usr/bin/chromium``, driven by Playwright's
sync API; ``playwright install`` is never needed). The request table is edited through its own cell
editor and cell menu, as a person would. Each test module sets ``pytestmark = PYTESTMARK``, which
skips it when Chromium or the playwright package is missing.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from engine.page.figures.mask_heatmaps import WINDOW_COLOR

try:
    from playwright.sync_api import Page, expect, sync_playwright
except ImportError:  # the playwright package is optional: browser tests are skipped without it
    Page = expect = sync_playwright = None

CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = Path(__file__).resolve().parents[3] / "screenshots"  # gitignored; for people to see
SCREENSHOTS.mkdir(exist_ok=True)
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
REMOTE_NICE = 19  # a browser that stands in for a person on another machine (``remote_chromium``)
RUN_TIMEOUT_MS = 120_000  # one Run of two tiny requests takes seconds; generous for a busy CI
PLOT_IDS = [
    "static_timeline_plot",
    "continuous_timeline_plot",
    "packed_mask_plot",
    "static_mask_plot",
    "block_map_plot",  # the default KV mode is paged
    "latency_cdf_plot",
    "step_usage_plot",
]
RUNNING_STATUS = re.compile(r"Running · [\d.]+ s")  # a run's live status line
SUCCESS_STATUS = re.compile(
    r"2 requests · 2 slots · static [\d.]+ s · continuous [\d.]+ s · .*"
    r"✓ all match model\.generate token for token"
)
XSS_PROMPT = "<img src=x onerror=alert(1)>"
MASK_PLOT = "#packed_mask_plot .js-plotly-plot"
# the packed mask's cells: how many Plotly drew in the band's colour, and in any colour
MASK_CELLS_JS = """(el, bandColour) => {
    const trace = el.data[0], scale = trace.colorscale;
    const colour = v => scale[Math.min(2 * Math.round(v), scale.length - 1)][1];
    const z = el.calcdata[0][0].z;  // as drawn, decoded (the figure's own z is base64)
    const cells = Array.from(z).flatMap(row => Array.from(row))
        .filter(v => v !== null && v !== undefined && !Number.isNaN(v));
    return {band: cells.filter(v => colour(v) === bandColour).length, drawn: cells.length,
            subtitle: (el.querySelector('.gtitle-subtitle') || {}).textContent || ''};
}"""

PYTESTMARK = [
    pytest.mark.browser,
    pytest.mark.skipif(sync_playwright is None, reason="the playwright package is not installed"),
    pytest.mark.skipif(
        not os.access(CHROMIUM, os.X_OK),
        reason=f"{CHROMIUM} is missing (install it with: apt-get install chromium)",
    ),
]


def remote_chromium(folder: Path) -> str:
    """An executable in ``folder`` that starts Chromium at nice ``REMOTE_NICE``, for tests whose
    browser stands in for a person on another machine while the page measures something (as
    ``tools.room_load`` runs its browsers): on a 2-CPU host a browser at the page's
    priority takes CPU from the server being timed. Its processes inherit the nice value; the
    pipe to Playwright (file descriptors 3 and 4) passes through ``exec`` unchanged."""
    wrapper = folder / "remote-chromium"
    wrapper.write_text(f'#!/bin/sh\nexec nice -n {REMOTE_NICE} {CHROMIUM} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def _grid(page: Page, elem_id: str):
    return page.locator(f"#{elem_id} [role=grid]")


def _cell(page: Page, elem_id: str, row: int, col: int):
    return _grid(page, elem_id).locator(f'[data-testid="cell-{row}-{col}"]')


def _num_rows(page: Page, elem_id: str) -> int:
    return _grid(page, elem_id).locator('[role=gridcell][data-col="0"]').count()


def _row_action(page: Page, row: int, action: str) -> None:
    """Open the request table's cell menu on ``row`` and pick ``action`` ("Delete row", ...)."""
    cell = _cell(page, "requests_table", row, 0)
    cell.click()
    cell.locator('button[aria-label="Open cell menu"]').click()
    page.get_by_role("menuitem", name=action).click()


def _edit_cell(page: Page, row: int, col: int, value) -> None:
    """Type ``value`` into a request-table cell with its own editor and commit it with Enter."""
    cell = _cell(page, "requests_table", row, col)
    cell.dblclick()
    editor = cell.locator('textarea[aria-label="Edit cell"]')
    editor.fill(str(value))
    editor.press("Enter")
    expect(cell).to_contain_text(str(value))


def set_requests(page: Page, rows: list[tuple[str, int]]) -> None:
    """Replace the request table with ``rows`` (prompt, cap) through the table's own UI."""
    while _num_rows(page, "requests_table") > len(rows):
        before = _num_rows(page, "requests_table")
        _row_action(page, before - 1, "Delete row")
        expect(
            _grid(page, "requests_table").locator('[role=gridcell][data-col="0"]')
        ).to_have_count(before - 1)
    while _num_rows(page, "requests_table") < len(rows):
        _row_action(page, _num_rows(page, "requests_table") - 1, "Add row below")
    for i, (prompt, cap) in enumerate(rows):
        _edit_cell(page, i, 0, prompt)
        _edit_cell(page, i, 1, cap)
    shown = [
        (
            _cell(page, "requests_table", i, 0).inner_text().replace("⋮", "").strip(),
            _cell(page, "requests_table", i, 1).inner_text().replace("⋮", "").strip(),
        )
        for i in range(_num_rows(page, "requests_table"))
    ]
    assert shown == [(p, str(c)) for p, c in rows], f"request table shows {shown}"


def set_slots(page: Page, num_slots: int) -> None:
    """Type the slot count into the slider's number box."""
    box = page.locator("#slots_slider input[type=number]")
    box.fill(str(num_slots))
    box.press("Enter")
    expect(page.locator("#slots_slider input[type=range]")).to_have_value(str(num_slots))


def tick_servers(page: Page, names: list[str]) -> None:
    """Tick the host's servers ``names`` under "Also run on the host's servers" (none is ticked
    when the page opens)."""
    for name in names:
        box = page.locator("#servers_checkbox").get_by_label(name, exact=True)
        box.check()
        expect(box).to_be_checked()


def open_session(browser, url: str, width: int = 1400, height: int = 1000) -> Page:
    """Another person: a page at ``url`` in a browser context of its own (its own Gradio
    session), once the request table is in."""
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.goto(url)
    page.locator('#requests_table [data-testid="cell-0-0"]').wait_for(timeout=30_000)
    return page


# The note under Run while a run is in flight: pressed, waiting for the model, running.
IN_FLIGHT_NOTE = re.compile(r"Run pressed:|Waiting for the model:|Running:")
# Keeps the texts the note under Run takes from the click on. A run ended when the note said it
# was in flight and no longer does, and the status line's progress tracker is hidden. The tracker
# alone cannot say it: Run's press (unqueued) and the run (queued) both update the status line, and
# the press's answer may come after the run's first update.
WATCH_NOTE_JS = """() => {
    const text = () => document.querySelector('#run_note_markdown [data-testid=markdown]')
        .innerText;
    window.cbpNotes = [];
    new MutationObserver(() => { window.cbpNotes.push(text()); })
        .observe(document.querySelector('#run_note_markdown'),
                 {subtree: true, childList: true, characterData: true});
}"""
RUN_ENDED_JS = """(inFlight) => {
    const note = document.querySelector('#run_note_markdown [data-testid=markdown]').innerText;
    const tracker = document.querySelector('#status_markdown [data-testid=status-tracker]');
    const pattern = new RegExp(inFlight);
    return window.cbpNotes.some((seen) => pattern.test(seen)) && !pattern.test(note)
        && (!tracker || tracker.classList.contains('hide'));
}"""


def run_and_wait(page: Page, timeout_ms: int = RUN_TIMEOUT_MS) -> None:
    """Press Run and wait until the run ended: the note under Run said it was in flight (pressed,
    waiting, running) and no longer does, and the status line's progress tracker is hidden."""
    page.evaluate(WATCH_NOTE_JS)
    page.locator("#run_button").click()
    wait_for_run_end(page, timeout_ms)


def wait_for_run_end(page: Page, timeout_ms: int = RUN_TIMEOUT_MS) -> None:
    """Wait for the end of a run whose click came after ``WATCH_NOTE_JS`` (``run_and_wait``)."""
    page.wait_for_function(RUN_ENDED_JS, arg=IN_FLIGHT_NOTE.pattern, timeout=timeout_ms)


def status_text(page: Page) -> str:
    return page.locator("#status_markdown [data-testid=markdown]").inner_text()


def plot_summary(page: Page, elem_id: str) -> dict:
    """Traces in the figure data and trace groups Plotly actually drew in the SVG."""
    plot = page.locator(f"#{elem_id} .js-plotly-plot")
    expect(plot).to_have_count(1)
    return plot.evaluate(
        """el => ({
            num_data: (el.data || []).length,
            num_drawn: el.querySelectorAll('.cartesianlayer .trace, .hm image, .heatmaplayer image')
                .length,
            title: (el.querySelector('.gtitle') || {}).textContent || '',
        })"""
    )


def table(page: Page, elem_id: str) -> tuple[list[str], list[list[str]]]:
    """A table's headers and body cells, without the column menus' "⋮"."""
    headers = [
        h.replace("⋮", "").strip()
        for h in page.locator(f"#{elem_id} thead th").all_inner_texts()
        if h.strip()
    ]
    rows = [
        [
            _cell(page, elem_id, r, c).inner_text().replace("⋮", "").strip()
            for c in range(len(headers))
        ]
        for r in range(_num_rows(page, elem_id))
    ]
    return headers, rows


def outputs_rows(page: Page) -> list[list[str]]:
    """The outputs table's body cells as text, row by row."""
    return [
        [_cell(page, "outputs_table", r, c).inner_text().strip() for c in range(6)]
        for r in range(_num_rows(page, "outputs_table"))
    ]


def assert_results(page: Page, prompts: list[str]) -> None:
    """Success status, every plot drawn, one checked outputs row per prompt."""
    status = status_text(page)
    assert SUCCESS_STATUS.search(status), f"status line does not report success: {status!r}"
    for elem_id in PLOT_IDS:
        summary = plot_summary(page, elem_id)
        assert summary["num_data"] > 0 and summary["num_drawn"] > 0, f"{elem_id} empty: {summary}"
    for elem_id, title in (
        ("static_timeline_plot", "Static batching — 2 slots"),
        ("continuous_timeline_plot", "Continuous batching — 2 slots"),
    ):
        assert title in plot_summary(page, elem_id)["title"], f"{elem_id} title is not {title!r}"
    rows = outputs_rows(page)
    assert [r[1] for r in rows] == prompts, f"outputs table prompts: {rows}"
    for row in rows:
        assert row[3] and row[4], f"{row[0]}: an engine's output is empty: {row}"
        assert row[5] == "✓", f"{row[0]}: outputs not marked as matching model.generate: {row}"


def _status(page: Page):
    return page.locator("#status_markdown [data-testid=markdown]")


def _download(page: Page, elem_id: str, name: str, folder: Path) -> Path:
    """Click a file component's download link for ``name``; the saved file."""
    link = page.locator(f'#{elem_id} a[data-testid="download-link"][download="{name}"]')
    with page.expect_download() as download:
        link.click()
    path = folder / name
    download.value.save_as(path)
    return path


def mask_cells(page: Page) -> dict:
    """The packed mask's cells as drawn: ``band`` (in the sliding window's colour), ``drawn``
    (all) and the figure's ``subtitle``."""
    return page.locator(MASK_PLOT).evaluate(MASK_CELLS_JS, WINDOW_COLOR)
