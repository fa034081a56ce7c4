"""Input in the browser: bad values, edits, HTML prompts and uploads, refused or shown safely."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from browser_kit import (
    PLOT_IDS,
    PYTESTMARK,
    XSS_PROMPT,
    Page,
    _cell,
    _download,
    _edit_cell,
    _num_rows,
    _status,
    assert_results,
    expect,
    outputs_rows,
    plot_summary,
    run_and_wait,
    set_requests,
    set_slots,
    status_text,
)

pytestmark = PYTESTMARK


def test_bad_input_shows_error_and_keeps_results(page: Page):
    """A cap of 0 shows the engine's message in a toast and in the status line (no error badge
    over it); earlier results stay, and the next run works."""
    rows = [("The capital of France is", 3), ("Water boils at", 4)]
    set_requests(page, rows)
    set_slots(page, 2)
    run_and_wait(page)
    assert_results(page, [p for p, _ in rows])
    before_outputs, before_status = outputs_rows(page), status_text(page)

    _edit_cell(page, 1, 1, 0)
    page.locator("#run_button").click()
    toast = page.locator('[data-testid="toast-text"]')
    expect(toast).to_contain_text("max_new_tokens 0 is out of range", timeout=30_000)
    assert "Row 2" in toast.inner_text(), f"error does not name the row: {toast.inner_text()!r}"
    expect(_status(page)).to_contain_text("Not run: Row 2: max_new_tokens 0 is out of range")
    status = status_text(page)
    assert status.endswith(f"Showing the previous run: {before_status}"), status
    tracker = page.locator("#status_markdown [data-testid=status-tracker]")
    expect(tracker).to_have_class(re.compile(r"\bhide\b"))  # no "Error" badge over the status
    assert outputs_rows(page) == before_outputs, "the error wiped the previous outputs"
    for elem_id in PLOT_IDS:
        assert plot_summary(page, elem_id)["num_drawn"] > 0, f"the error cleared {elem_id}"

    page.locator('[data-testid="toast-close"]').first.click()
    _edit_cell(page, 1, 1, 6)
    run_and_wait(page)
    assert_results(page, [p for p, _ in rows])
    assert outputs_rows(page)[1][2] == "6", "the run after the error did not use the fixed cap"


def _fill_engine_setting(page: Page, elem_id: str, text: str) -> None:
    """Type ``text`` into a number box of the Engine settings accordion (opened if closed)."""
    box = page.locator(f"#{elem_id} input")
    if not box.is_visible():
        page.get_by_text("Engine settings", exact=True).click()
    expect(box).to_be_visible()
    for _ in range(5):  # the accordion may still be rendering its contents: fill until it sticks
        box.fill(text)
        box.press("Tab")
        page.wait_for_timeout(300)
        if box.input_value() == text:
            break
    expect(box).to_have_value(text)


@pytest.mark.parametrize(
    ("elem_id", "what"),
    [("block_size_number", "Block size"), ("token_budget_number", "Token budget")],
)
def test_fractional_knob_is_refused_not_rounded(page: Page, elem_id: str, what: str):
    """A fractional block size or token budget reaches the check (not rounded by the page) and
    is refused in the status line."""
    set_requests(page, [("Water boils at", 3)])
    _fill_engine_setting(page, elem_id, "7.5")
    page.locator("#run_button").click()
    expect(_status(page)).to_contain_text(f"Not run: {what} must be a whole number", timeout=30_000)


def test_editing_the_table_leaves_the_preset(page: Page):
    """After a cell edit the preset dropdown is empty and its explanation is replaced."""
    preset_text = page.locator("#preset_markdown").inner_text()
    assert "two waves" in preset_text, preset_text  # the default preset's explanation
    _edit_cell(page, 0, 1, 7)
    expect(page.locator("#preset_markdown")).to_contain_text("edited from a preset")
    expect(page.locator("#preset_dropdown input")).to_have_value("")


def test_html_prompt_is_shown_as_text(page: Page):
    """A prompt that looks like HTML appears literally in the outputs table, never as an element."""
    rows = [(XSS_PROMPT, 3), ("The capital of France is", 3)]
    set_requests(page, rows)
    set_slots(page, 2)
    run_and_wait(page)
    assert_results(page, [p for p, _ in rows])
    outputs = page.locator("#outputs_table")
    assert outputs.locator('img[src="x"]').count() == 0, "the prompt became an <img> element"
    assert page.locator('img[src="x"]').count() == 0, "an <img src=x> was created on the page"
    prompt_cell = _cell(page, "outputs_table", 0, 1)
    expect(prompt_cell).to_have_text(XSS_PROMPT)  # the literal characters, tags included
    expect(prompt_cell).to_be_visible()
    assert not page.dialogs, f"the prompt's onerror ran: {page.dialogs}"


def test_upload_csv_fills_the_table_and_the_table_downloads(page: Page, tmp_path: Path):
    """An uploaded CSV fills the table; a bad one names its line and changes nothing; the table
    downloads as CSV."""
    from engine.workloads.workload_files import load_workload_file

    good = tmp_path / "workload.csv"
    good.write_text("prompt,max_new_tokens,arrival_s\nHello there,5,\nGoodbye,3,0.5\n")
    with page.expect_file_chooser() as chooser:
        page.locator("#upload_button").click()
    chooser.value.set_files(str(good))
    expect(page.locator("#preset_markdown")).to_contain_text("Uploaded 2 requests", timeout=20_000)
    assert _num_rows(page, "requests_table") == 2
    expect(_cell(page, "requests_table", 1, 0)).to_contain_text("Goodbye")
    expect(_cell(page, "requests_table", 1, 2)).to_contain_text("0.5")

    page.locator("#table_button").click()
    saved = _download(page, "table_file", "workload.csv", tmp_path / "saved")
    assert load_workload_file(saved) == load_workload_file(good), saved.read_text()

    bad = tmp_path / "bad.csv"
    bad.write_text("prompt,max_new_tokens\nfine,3\noops,many\n")
    with page.expect_file_chooser() as chooser:
        page.locator("#upload_button").click()
    chooser.value.set_files(str(bad))
    toast = page.locator('[data-testid="toast-text"]')
    expect(toast).to_contain_text("bad.csv line 3", timeout=20_000)
    expect(_cell(page, "requests_table", 1, 0)).to_contain_text("Goodbye")  # table kept
    tracker = page.locator("#requests_table [data-testid=status-tracker]")
    expect(tracker).to_have_class(re.compile(r"\bhide\b"))  # no "Error" badge over the table


def test_a_warning_stays_under_the_table_until_the_next_action(page: Page, server_url, tmp_path):
    """A refused upload and a link's ignored parameter stay named under the table after their
    toasts have gone, until the next action (a cell edited, a preset chosen)."""
    note = page.locator("#warning_html")
    bad = tmp_path / "bad.csv"
    bad.write_text("prompt,max_new_tokens\nfine,3\noops,many\n")
    with page.expect_file_chooser() as chooser:
        page.locator("#upload_button").click()
    chooser.value.set_files(str(bad))
    expect(note).to_contain_text("bad.csv line 3", timeout=20_000)
    expect(note).to_contain_text("Not loaded:")
    _close_toasts(page)
    expect(note).to_contain_text("bad.csv line 3")  # a state: no toast, the note still there
    _edit_cell(page, 0, 1, 7)
    expect(note).not_to_contain_text("bad.csv", timeout=10_000)

    page.goto(f"{server_url}?slots=99&kv=odd")
    expect(note).to_contain_text("slots='99' is ignored", timeout=30_000)
    expect(note).to_contain_text("kv='odd' is ignored")
    _close_toasts(page)
    expect(note).to_contain_text("slots='99' is ignored")
    page.locator("#preset_dropdown input").click()
    page.get_by_role("option").nth(1).click()
    expect(note).not_to_contain_text("ignored", timeout=10_000)


def _close_toasts(page: Page) -> None:
    """Wait until every toast on the page has gone by itself (Gradio's toasts last 7 to 15 s)."""
    toasts = page.locator('[data-testid="toast-body"]')
    expect(toasts.first).to_be_visible(timeout=20_000)
    expect(toasts).to_have_count(0, timeout=60_000)
