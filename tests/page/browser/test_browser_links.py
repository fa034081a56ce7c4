"""Links and downloads in the browser: a setup link presets the page; the run's files download."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from browser_kit import (
    PYTESTMARK,
    Page,
    _cell,
    _download,
    _edit_cell,
    _num_rows,
    assert_results,
    expect,
    open_session,
    run_and_wait,
    set_requests,
)

pytestmark = PYTESTMARK
# The step the slider reads, and the one the packed mask's title names ("Packed step N: ...").
STEPS_SHOWN_JS = """() => [
    document.querySelector('#step_slider input[type=range]')?.value,
    document.querySelector('#packed_mask_plot .gtitle')?.textContent.match(/step (\\d+)/)?.[1],
]"""
SLIDER_AND_MASK_AT = f"(step) => ({STEPS_SHOWN_JS})().every((shown) => shown === String(step))"


def test_link_presets_the_page(page: Page, server_url: str):
    """Opening ?preset=long-tail&slots=4 loads that preset's table and sets 4 slots; an unknown
    preset is named in a warning."""
    from engine.page.inputs import presets

    rows, _, _ = presets.apply_preset(presets.by_slug("long-tail"))
    page.goto(f"{server_url}?preset=long-tail&slots=4")
    first_prompt = _cell(page, "requests_table", 0, 0)
    expect(first_prompt).to_contain_text(rows[0][0], timeout=30_000)
    assert _num_rows(page, "requests_table") == len(rows), "the preset's rows were not loaded"
    expect(page.locator("#slots_slider input[type=range]")).to_have_value("4")
    expect(page.locator("#preset_markdown")).to_contain_text("long tail")

    page.goto(f"{server_url}?preset=nope&slots=4")
    toast = page.locator('[data-testid="toast-text"]')
    expect(toast).to_contain_text("preset='nope' is ignored: no such preset", timeout=30_000)
    expect(page.locator("#slots_slider input[type=range]")).to_have_value("4")


def test_setup_link_step_and_downloads(page: Page, server_url: str, tmp_path: Path):
    """A ?preset&slots&step link presets the page and, after Run, the step; downloads parse."""
    import csv
    import json

    from engine.page.inputs import link_table, presets
    from engine.workloads.workload import parse_table

    preset_rows, _, _ = presets.apply_preset(presets.by_slug("equal-caps"))
    page.goto(f"{server_url}?preset=equal-caps&slots=2&step=3")
    expect(_cell(page, "requests_table", 0, 0)).to_contain_text(preset_rows[0][0], timeout=30_000)
    assert _num_rows(page, "requests_table") == len(preset_rows), "the preset was not applied"
    expect(page.locator("#slots_slider input[type=range]")).to_have_value("2")

    rows = [("The capital of France is", 4), ("Water boils at", 6)]
    set_requests(page, rows)  # small caps keep the run short; the link's step still applies
    run_and_wait(page)
    assert_results(page, [p for p, _ in rows])
    # The slider and the views move to the link's step in one update (link_step_event): wait
    # for that state, slider and mask title together, as long as a loaded machine takes.
    page.wait_for_function(SLIDER_AND_MASK_AT, arg=3, timeout=120_000)

    page.locator("#link_button").click()
    link = page.locator("#link_textbox textarea, #link_textbox input").first
    expect(link).to_have_value(re.compile(r"^http://127\.0\.0\.1:\d+/\?"), timeout=10_000)
    # the table was edited after the link's preset, so the link carries it instead of a preset
    query = parse_qs(urlsplit(link.input_value()).query)
    assert query.keys() == {"slots", "step", "table"}, query
    assert (query["slots"], query["step"]) == (["2"], ["3"]), query
    linked = parse_table(link_table.decode_table(query["table"][0]))  # typed caps come as text
    assert linked == parse_table(rows), f"the link's table is {linked}"

    table = list(csv.DictReader(_download(page, "downloads_file", "requests.csv", tmp_path).open()))
    assert sorted((r["engine"], r["prompt"]) for r in table) == sorted(
        (e, p) for e in ("static", "continuous") for p, _ in rows
    ), f"requests.csv rows: {table}"
    trace = json.loads(
        _download(page, "downloads_file", "trace.perfetto.json", tmp_path).read_text()
    )
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X" and re.fullmatch(r"R\d+", e["name"])]
    assert len(spans) == 2 * len(rows), f"want one request span per engine and request: {spans}"

    shot = tmp_path / "playground.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")


def test_a_links_step_holds_on_its_first_view_and_in_the_copied_link(page: Page, server_url: str):
    """``?preset=seed&slots=3&step=3`` (the recorded run's own setup) shows that run at step 3,
    slider and mask together, before any Run; "Copy link" then writes step=3 (issue 51, item 8)."""
    page.goto(f"{server_url}?preset=seed&slots=3&step=3")
    page.wait_for_function(SLIDER_AND_MASK_AT, arg=3, timeout=60_000)
    page.locator("#link_button").click()
    link = page.locator("#link_textbox textarea, #link_textbox input").first
    expect(link).to_have_value(re.compile(r"^http://127\.0\.0\.1:\d+/\?"), timeout=10_000)
    query = parse_qs(urlsplit(link.input_value()).query)
    assert query.get("step") == ["3"], f"the copied link lost the link's step: {query}"


def test_copied_link_carries_an_edited_table_and_a_setting(page: Page, browser):
    """A cap edited in the table and a changed engine setting travel in the copied link: opened
    in another session, the page shows the same table and the same setting."""
    from engine.page.inputs import presets

    rows, _, _ = presets.apply_preset(presets.DEFAULT_PRESET)
    _edit_cell(page, 1, 1, 7)  # the second request's cap, 50 in the preset
    page.get_by_text("Engine settings", exact=True).click()
    page.locator("#policy_radio label").filter(has_text="prefill first").first.click()
    expect(page.locator("#policy_radio input[type=radio]:checked")).to_have_value("prefill_first")

    page.locator("#link_button").click()
    link = page.locator("#link_textbox textarea, #link_textbox input").first
    expect(link).to_have_value(re.compile(r"^http://127\.0\.0\.1:\d+/\?"), timeout=10_000)
    query = parse_qs(urlsplit(link.input_value()).query)
    assert query["policy"] == ["prefill_first"] and "table" in query, query
    assert "preset" not in query, f"an edited table still names its preset: {query}"

    other = open_session(browser, link.input_value())
    cap = _cell(other, "requests_table", 1, 1)
    expect(cap).to_contain_text("7", timeout=30_000)
    assert _num_rows(other, "requests_table") == len(rows), "the link's table lost rows"
    for i, row in enumerate(rows):
        shown = _cell(other, "requests_table", i, 0).inner_text().replace("⋮", "").strip()
        assert shown == row[0], f"row {i}: {shown!r}, not {row[0]!r}"
    expect(other.locator("#preset_markdown")).to_contain_text("Requests from a link")
    expect(other.locator("#preset_dropdown input")).to_have_value("")
    other.get_by_text("Engine settings", exact=True).click()
    checked = other.locator("#policy_radio input[type=radio]:checked")
    expect(checked).to_have_value("prefill_first", timeout=10_000)
    other.context.close()
