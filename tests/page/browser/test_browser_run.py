"""A run in the browser: timelines, masks and checked outputs; live progress, Stop, the queue."""

from __future__ import annotations

import re
import time
from pathlib import Path

from browser_kit import (
    PYTESTMARK,
    RUN_TIMEOUT_MS,
    RUNNING_STATUS,
    SCREENSHOTS,
    SUCCESS_STATUS,
    Page,
    _status,
    assert_results,
    expect,
    open_session,
    outputs_rows,
    plot_summary,
    run_and_wait,
    set_requests,
    set_slots,
    status_text,
)

pytestmark = PYTESTMARK


def test_run_draws_timelines_masks_and_checked_outputs(page: Page, tmp_path: Path):
    """A small run draws both timelines, both masks and a ✓-checked outputs table."""
    rows = [("The capital of France is", 3), ("Today's weather is so", 5)]
    set_requests(page, rows)
    set_slots(page, 2)
    expect(page.locator("#reference_checkbox input[type=checkbox]")).to_be_checked()
    run_and_wait(page)
    assert_results(page, [p for p, _ in rows])
    shot = tmp_path / "playground.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")

    # Scrubbing: one step right redraws the masks, the block map and both cursors, no new run.
    slider = page.locator("#step_slider input[type=range]")
    step, status = int(slider.input_value()) + 1, status_text(page)
    slider.focus()
    slider.press("ArrowRight")
    expect(page.locator("#packed_mask_plot .gtitle")).to_contain_text(f"Packed step {step}:")
    expect(page.locator("#block_map_plot .gtitle")).to_have_text(f"KV block map at step {step}")
    cursor_js = "el => el.layout.shapes.filter(s => s.name === 'cursor').map(s => s.x0)"
    page.locator("#x_axis_radio").get_by_text("step index").click()
    for elem_id in ("static_timeline_plot", "continuous_timeline_plot"):
        plot = page.locator(f"#{elem_id} .js-plotly-plot")
        page.wait_for_function(
            f"() => document.querySelector('#{elem_id} .js-plotly-plot').layout.xaxis.title.text"
            ".startsWith('step')"
        )
        assert plot.evaluate(cursor_js) == [step], f"{elem_id} cursor not at step {step}"
    assert status_text(page) == status, "scrubbing ran the model again"


# --- a run in progress: live progress, Stop, closed tab, queue ----------------------------------

LONG_PROMPT = "Once upon a time in a land far away,"
LONG_CAP = 400  # ~25 s per engine on a 2-core CPU: far longer than any check below waits
# The live-progress run's long request: its continuous run must outlast several of the page's
# progress reports (0.5 s apart) after the short request ends; at 60 tokens it took 1.8 s and a
# fresh-clone run saw no report between its start and its end
PROGRESS_CAP = 240
PROMPT_RUN_S = 30  # a 2-request run after a cancel must finish within this (uncancelled: > 60 s)


def _timed_run(page: Page, rows: list[tuple[str, int]]) -> float:
    """Run ``rows`` to the end and return the seconds it took, checking its results."""
    start = time.monotonic()
    run_and_wait(page)
    elapsed_s = time.monotonic() - start
    assert_results(page, [p for p, _ in rows])
    return elapsed_s


def test_live_progress_appears_before_the_run_ends(page: Page):
    """While a run goes the status counts steps and finished requests, and outputs fill in."""
    set_requests(page, [(LONG_PROMPT, PROGRESS_CAP), ("The sky is", 3)])
    set_slots(page, 2)
    page.locator("#run_button").click()
    expect(_status(page)).to_contain_text(RUNNING_STATUS, timeout=60_000)
    expect(_status(page)).to_contain_text(
        re.compile(r"static batching: \d+ steps?, [0-2]/2 requests done")
    )
    expect(_status(page)).to_contain_text(
        re.compile(r"continuous batching: \d+ steps?, 1/2 requests done"), timeout=60_000
    )
    shown = outputs_rows(page)
    assert shown[1][4] and not shown[0][4], f"continuous outputs not filling in: {shown}"
    assert plot_summary(page, "continuous_timeline_plot")["num_drawn"] > 0, "no live timeline"
    expect(_status(page)).to_contain_text("✓ all match", timeout=RUN_TIMEOUT_MS)
    assert outputs_rows(page)[0][4], "the long request's output is missing at the end"


def test_stop_cancels_keeps_results_and_the_next_run_works(page: Page):
    """Stop ends a long run at once, the earlier results stay, no error badge appears, and the
    next run is prompt."""
    rows = [("The capital of France is", 3), ("Water boils at", 4)]
    set_requests(page, rows)
    set_slots(page, 2)
    run_and_wait(page)
    before = outputs_rows(page)
    set_requests(page, [(LONG_PROMPT, LONG_CAP), ("Rivers flow into", 3)])
    page.locator("#run_button").click()
    expect(_status(page)).to_contain_text(RUNNING_STATUS, timeout=60_000)
    page.locator("#stop_button").click()
    expect(_status(page)).to_contain_text("Stopped before the end", timeout=10_000)
    _assert_no_error_badge(page)
    assert outputs_rows(page) == before, "the stop did not put the earlier outputs back"
    set_requests(page, rows)
    elapsed_s = _timed_run(page, rows)
    print(f"run after Stop: {elapsed_s:.1f} s")
    assert elapsed_s < PROMPT_RUN_S, f"the run after Stop took {elapsed_s:.0f} s"


def _assert_no_error_badge(page: Page) -> None:
    tracker = page.locator("#status_markdown [data-testid=status-tracker]")
    page.wait_for_timeout(1000)  # a late error message from the server would show by now
    assert "error" not in (tracker.get_attribute("class") or ""), "an Error badge after Stop"
    assert "Error" not in tracker.inner_text(), "an Error badge after Stop"


# Every text the status line shows from now on, in order, in window.cbpStatusSeen (one shown for
# a moment only, between two updates, too).
RECORD_STATUS_JS = """() => {
    const block = document.getElementById("status_markdown");
    const text = () => block.querySelector("[data-testid=markdown]").innerText.trim();
    window.cbpStatusSeen = [text()];
    new MutationObserver(() => {
        const seen = window.cbpStatusSeen, now = text();
        if (now !== seen[seen.length - 1]) seen.push(now);
    }).observe(block, {subtree: true, childList: true, characterData: true});
}"""
# The stopped run's end ("Stopped before the end"), and after it the new run's progress.
STOPPED_THEN_RUNNING_JS = """(running) => {
    const seen = window.cbpStatusSeen;
    const stopped = seen.findIndex(t => t.includes("Stopped before the end"));
    return stopped >= 0 && seen.slice(stopped + 1).some(t => new RegExp(running).test(t));
}"""


def test_run_pressed_right_after_stop_starts(page: Page):
    """Run pressed 0.2 s after Stop, while the stopped run still ends, starts a new run; the
    status line says "Run pressed" at once, then the stopped run's end, then the new run."""
    rows = [("Cats like to", 3), ("Dogs enjoy", 2)]
    set_requests(page, [(LONG_PROMPT, LONG_CAP), ("Rivers flow into", 3)])
    set_slots(page, 2)
    page.locator("#run_button").click()
    expect(_status(page)).to_contain_text(RUNNING_STATUS, timeout=60_000)
    page.evaluate(RECORD_STATUS_JS)
    page.locator("#stop_button").click()
    page.wait_for_timeout(200)
    page.locator("#run_button").click()
    expect(_status(page)).to_contain_text("Run pressed", timeout=5_000)  # the press's answer
    page.wait_for_function(STOPPED_THEN_RUNNING_JS, arg=RUNNING_STATUS.pattern, timeout=30_000)
    page.locator("#stop_button").click()  # the long table again: stop it, then a short run
    expect(_status(page)).to_contain_text("Stopped before the end", timeout=10_000)
    _assert_no_error_badge(page)
    set_requests(page, rows)
    _timed_run(page, rows)


# Stop, then Run and Stop three more times, 80 ms apart: all while the stopped run still ends
# (it puts the previous results back), so the browser defers each Run click and replays the last.
QUICK_PAIRS_JS = """() => {
    const click = (id) => document.getElementById(id).click();
    ["stop", "run", "stop", "run", "stop", "run", "stop"].forEach(
        (name, i) => setTimeout(() => click(name + "_button"), 80 * i));
}"""


def test_quick_run_stop_pairs_end_stopped_and_the_next_run_runs(page: Page):
    """Stop, then three quick Run/Stop pairs while the stopped run still ends: nothing runs after
    the last Stop (the status stays on Stopped), no Stop said nothing was running, and the next
    Run runs to the end."""
    set_requests(page, [(LONG_PROMPT, LONG_CAP), ("Rivers flow into", 3)])
    set_slots(page, 2)
    page.locator("#run_button").click()
    expect(_status(page)).to_contain_text(RUNNING_STATUS, timeout=60_000)
    page.evaluate(QUICK_PAIRS_JS)
    expect(_status(page)).to_contain_text("Stopped before", timeout=15_000)
    page.wait_for_timeout(5_000)  # a run that the last Stop missed shows its progress by now
    assert status_text(page).startswith("Stopped before"), (
        f"after the last Stop: {status_text(page)}"
    )
    toasts = page.locator('[data-testid="toast-text"]', has_text="Nothing is running")
    assert toasts.count() == 0, "Stop said nothing was running between Run presses"
    _assert_no_error_badge(page)
    rows = [("Foxes hide in", 3), ("Owls hunt at", 2)]  # a setup no other test runs: not replayed
    set_requests(page, rows)
    _timed_run(page, rows)
    assert not status_text(page).startswith("Shown at once"), "the next Run was not run live"


def test_stop_with_nothing_running_says_so(page: Page):
    """Stop on a page with no run going changes nothing and says there is nothing to stop."""
    before = status_text(page)
    page.locator("#stop_button").click()
    toast = page.locator('[data-testid="toast-text"]')
    expect(toast).to_contain_text("Nothing is running", timeout=10_000)
    assert status_text(page) == before, "Stop with nothing running changed the status line"
    assert "Stopped" not in status_text(page)


def test_queue_place_is_shown_and_closing_the_tab_cancels(page: Page, browser, server_url):
    """A second user sees their true place, the total and their wait in words under Run, in view
    and readable, and in the status line; when the first closes the tab, their run goes."""
    first = open_session(browser, server_url)
    set_requests(first, [(LONG_PROMPT, LONG_CAP)])
    first.locator("#run_button").click()
    expect(_status(first)).to_contain_text(RUNNING_STATUS, timeout=60_000)
    rows = [("Cats like to", 4), ("Dogs enjoy", 3)]  # a setup no other test runs: not replayed
    set_requests(page, rows)
    set_slots(page, 2)
    page.locator("#run_button").click()
    note = page.locator("#run_note_markdown")
    waiting = re.compile(r"Waiting for the model: place 2 of 2 \(yours is next, after the run")
    expect(note).to_contain_text(waiting, timeout=10_000)
    expect(note).to_contain_text(re.compile(r"waited \d+ s"))
    expect(_status(page)).to_contain_text(waiting)
    _assert_readable(page, "#run_note_markdown")
    assert note.bounding_box()["y"] < page.viewport_size["height"], "the place is below the fold"
    shot = SCREENSHOTS / "queued-status.png"
    page.screenshot(path=str(shot))
    print(f"screenshot: {shot}")
    closed_s = time.monotonic()
    first.context.close()
    expect(_status(page)).to_contain_text(SUCCESS_STATUS, timeout=RUN_TIMEOUT_MS)
    elapsed_s = time.monotonic() - closed_s
    print(f"queued run done {elapsed_s:.1f} s after the first tab closed")
    assert elapsed_s < PROMPT_RUN_S, f"the queued run ended {elapsed_s:.0f} s after the close"
    assert_results(page, [p for p, _ in rows])
    expect(note).to_contain_text("Finished")


def _assert_readable(page: Page, selector: str) -> None:
    """The element is on screen, uncovered (its centre hits it) and not clipped by its block."""
    box = page.locator(selector).bounding_box()
    assert box and box["height"] >= 12 and box["width"] >= 200, f"{selector} too small: {box}"
    hit = page.evaluate(
        """sel => { const e = document.querySelector(sel); const r = e.getBoundingClientRect();
            const at = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
            const block = e.closest('.block').getBoundingClientRect();
            return {covered: !(at === e || e.contains(at)),
                    clipped: r.bottom > block.bottom + 1 || r.right > block.right + 1}; }""",
        selector,
    )
    assert not hit["covered"] and not hit["clipped"], f"{selector} is not readable: {hit}"


def test_stop_while_queued_leaves_the_queue(page: Page, browser, server_url):
    """Stop pressed while one's run waits in the queue takes it out at once, and says so."""
    first = open_session(browser, server_url)
    set_requests(first, [(LONG_PROMPT, LONG_CAP)])
    first.locator("#run_button").click()
    expect(_status(first)).to_contain_text(RUNNING_STATUS, timeout=60_000)
    set_requests(page, [("Birds sing", 3)])  # a setup no other test runs: not replayed
    page.locator("#run_button").click()
    expect(page.locator("#run_note_markdown")).to_contain_text("place 2 of 2", timeout=10_000)
    page.locator("#stop_button").click()
    expect(_status(page)).to_contain_text("Stopped before it started: it left the queue.")
    _assert_no_error_badge(page)
    first.locator("#stop_button").click()
    expect(_status(first)).to_contain_text("Stopped before the end", timeout=10_000)
    first.context.close()
