"""The page as people meet it: the recorded run before any Run, drops on the table, hover
definitions, and the layout on a phone (390 × 844) and at 1,280 px, checked and screenshotted.

Screenshots go to ``screenshots/`` at the repository's root (gitignored), for a person to look at.
"""

from __future__ import annotations

import re

from browser_kit import (
    PLOT_IDS,
    PYTESTMARK,
    SCREENSHOTS,
    Page,
    _cell,
    _num_rows,
    _status,
    expect,
    plot_summary,
)

pytestmark = PYTESTMARK

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 800}


def test_page_opens_on_the_recorded_run(page: Page):
    """Before any Run: the status names the recording (device, dtype, date) and asks to press Run;
    every chart is drawn, the tables are filled and the step slider redraws the step views; the
    downloads box, with no files yet, is not shown."""
    status = _status(page)
    expect(status).to_contain_text("Recorded run")
    expect(status).to_contain_text("press Run to measure it here")
    expect(page.locator("#downloads_file")).to_be_hidden()
    expect(status).to_contain_text(re.compile(r"CPU · float32.*\d{4}-\d\d-\d\d"))
    expect(status).to_contain_text(re.compile(r"continuous \d+ steps against static \d+"))
    _wait_for_plots(page)
    for elem_id in PLOT_IDS:
        summary = plot_summary(page, elem_id)
        assert summary["num_data"] > 0 and summary["num_drawn"] > 0, f"{elem_id}: {summary}"
    assert _num_rows(page, "metrics_table") == 2, "the metrics table is not filled"
    assert _num_rows(page, "outputs_table") == 6, "the outputs table is not filled"
    expect(_cell(page, "outputs_table", 0, 5)).to_have_text("✓")
    slider = page.locator("#step_slider input[type=range]")
    step = int(slider.input_value()) + 1
    slider.focus()
    slider.press("ArrowRight")
    expect(page.locator("#packed_mask_plot .gtitle")).to_contain_text(
        f"Packed step {step}:",
        timeout=30_000,  # redrawn by the server: slow on a busy machine
    )
    expect(page.locator("#static_mask_plot .gtitle")).to_contain_text(f"Static step {step}:")
    expect(page.locator("#step_slider")).to_contain_text("continuous 0–")


def test_a_link_to_another_setup_says_the_recorded_run_is_not_its_own(page: Page, server_url):
    """Opened at ?preset=one-long-many-short, the page keeps the recorded run under the linked
    preset's table and says so over it: the recorded run of the article's six requests, not of
    the linked preset, which Run measures; a link to the recorded setup keeps its own label."""
    page.goto(f"{server_url}?preset=one-long-many-short")
    status = _status(page)
    expect(status).to_contain_text("Not the linked setup", timeout=30_000)
    expect(status).to_contain_text("recorded run of “Article's six requests” at 3 slots")
    expect(status).to_contain_text("Press Run to measure “One long, many short” at 4 slots here")
    _wait_for_plots(page)
    page.goto(f"{server_url}?preset=seed&slots=3")
    expect(page.locator("#preset_markdown")).to_contain_text("six", timeout=30_000)
    page.wait_for_timeout(2000)  # the link's own events have ended
    expect(status).to_contain_text("press Run to measure it here")
    expect(status).not_to_contain_text("Not the linked setup")


def _wait_for_plots(page: Page) -> None:
    """Until every chart is drawn (Plotly loads lazily, slowly on a busy machine)."""
    for elem_id in PLOT_IDS:
        expect(page.locator(f"#{elem_id} .js-plotly-plot")).to_have_count(1, timeout=60_000)


def _drop_file(page: Page, name: str, text: str, on_text: bool = False) -> None:
    """Drop a file called ``name`` holding ``text`` onto the request table's first cell (with
    ``on_text``, onto the cell's text node, as Firefox aims drag events)."""
    page.locator('#requests_table [data-testid="cell-0-0"]').evaluate(
        """(cell, [name, text, onText]) => {
            const files = new DataTransfer();
            files.items.add(new File([text], name, {type: "text/plain"}));
            const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT,
                {acceptNode: n => n.textContent.trim() ? NodeFilter.FILTER_ACCEPT
                                                       : NodeFilter.FILTER_SKIP});
            const target = onText ? walker.nextNode() : cell;
            if (!target) throw new Error("the cell has no text node");
            for (const type of ["dragenter", "dragover", "drop"]) {
                target.dispatchEvent(new DragEvent(type,
                    {dataTransfer: files, bubbles: true, cancelable: true}));
            }
        }""",
        [name, text, on_text],
    )


def test_files_dropped_on_the_table_go_through_the_upload_checks(page: Page):
    """A drop on the table is parsed like an upload: a header-less CSV and a cap of "five" are
    refused naming the line (the table unchanged), and a JSONL file fills the table."""
    first_prompt = _cell(page, "requests_table", 0, 0).inner_text()
    toast = page.locator('[data-testid="toast-text"]')
    _drop_file(page, "noheader.csv", "Hello there,5\nGoodbye,3\n")
    expect(toast).to_contain_text("noheader.csv line 1: the header must name", timeout=20_000)
    _drop_file(page, "five.csv", "prompt,max_new_tokens\nHello,five\n")
    expect(toast.filter(has_text="five.csv line 2")).to_have_count(1, timeout=20_000)
    assert _cell(page, "requests_table", 0, 0).inner_text() == first_prompt, "a bad drop changed it"
    _drop_file(page, "w.jsonl", '{"prompt": "Dropped in", "max_new_tokens": 4}\n')
    expect(page.locator("#preset_markdown")).to_contain_text("Uploaded 1 request", timeout=20_000)
    assert _num_rows(page, "requests_table") == 1
    expect(_cell(page, "requests_table", 0, 0)).to_contain_text("Dropped in")


def test_a_jsonl_file_dropped_on_a_cells_text_is_uploaded(page: Page):
    """A JSONL file dropped on the text of a cell (Firefox's drag target) goes through the
    upload too, not to the table's own drop zone ("Only .csv, .tsv allowed")."""
    _drop_file(page, "t.jsonl", '{"prompt": "Dropped on text", "max_new_tokens": 4}\n', True)
    expect(page.locator("#preset_markdown")).to_contain_text("Uploaded 1 request", timeout=20_000)
    expect(_cell(page, "requests_table", 0, 0)).to_contain_text("Dropped on text")
    toasts = page.locator('[data-testid="toast-text"]').all_inner_texts()
    assert not [t for t in toasts if "allowed" in t], f"the table's own drop zone took it: {toasts}"


def test_metrics_columns_have_hover_definitions(page: Page):
    """Padding waste and slot utilisation carry hover definitions naming their denominators."""
    from engine.page.views.tables import METRIC_HELP

    for name in ("padding waste %", "slot utilisation %"):
        header = page.locator("#metrics_table th").filter(has_text=name).first
        expect(header).to_have_attribute("title", METRIC_HELP[name], timeout=10_000)
    expect(page.locator("#metrics_note")).to_contain_text("Different denominators")


def test_each_scheduling_policy_has_its_hover_text(page: Page):
    """Each choice of "Who gets the budget first", vLLM's order too, explains itself on hover."""
    from engine.page.panels.settings_panel import POLICY_HELP

    page.get_by_text("Engine settings", exact=True).click()
    for label, help_text in POLICY_HELP.items():
        choice = page.locator("#policy_radio label").filter(has_text=label).first
        expect(choice).to_have_attribute("title", help_text, timeout=10_000)
    choice = page.locator("#policy_radio label").filter(has_text="vLLM's order").first
    choice.scroll_into_view_if_needed()
    choice.hover()
    shot = SCREENSHOTS / "policy-radio.png"
    page.locator("#policy_radio").screenshot(path=str(shot))
    print(f"screenshot: {shot}")


# --- layout: phone and 1,280 px -------------------------------------------------------------------

BOXES_JS = """sel => Array.from(document.querySelectorAll(sel)).map(e => {
    const r = e.getBoundingClientRect();
    return {left: r.left, right: r.right, top: r.top, bottom: r.bottom, text: e.textContent};
})"""


def _boxes(page: Page, selector: str) -> list[dict]:
    return page.evaluate(BOXES_JS, selector)


def _overlap(a: dict, b: dict) -> bool:
    return (
        a["left"] < b["right"]
        and b["left"] < a["right"]
        and a["top"] < b["bottom"]
        and (b["top"] < a["bottom"])
    )


def _assert_titles_inside(page: Page, phone: bool = False) -> None:
    """Every chart's title (and subtitle) lies inside its chart; the toolbar is hidden at rest,
    or on a phone (no hover: a tap left it shown) lies in a strip of its own above the title."""
    for elem_id in PLOT_IDS:
        (svg,) = _boxes(page, f"#{elem_id} .main-svg")[:1]
        titles = _boxes(page, f"#{elem_id} .gtitle, #{elem_id} .gtitle-subtitle")
        for title in titles:
            inside = svg["left"] - 1 <= title["left"] and title["right"] <= svg["right"] + 1
            assert inside, f"{elem_id}: title {title['text']!r} cut off: {title} vs {svg}"
        opacity = page.locator(f"#{elem_id} .modebar-container").evaluate(
            "e => getComputedStyle(e).opacity"
        )
        if not phone:
            assert float(opacity) == 0, f"{elem_id}: the toolbar shows at rest, over the title"
            continue
        (toolbar,) = _boxes(page, f"#{elem_id} .modebar")[:1]
        over = [t["text"] for t in titles if _overlap(toolbar, t)]
        assert not over, f"{elem_id}: the toolbar lies over {over}"


def _assert_tables_readable(page: Page) -> None:
    """No table header is squeezed to a letter a line: each is wide enough for a short word."""
    for elem_id in ("metrics_table", "outputs_table"):
        for header in _boxes(page, f"#{elem_id} th"):
            width_px = header["right"] - header["left"]
            assert width_px >= 56, f"{elem_id}: header {header['text']!r} is {width_px:.0f} px"
    split = page.evaluate(  # a one-word header on two lines ("reques" over "t")
        """() => Array.from(document.querySelectorAll('#outputs_table th .header'))
            .filter(e => !e.textContent.trim().includes(' '))
            .filter(e => e.getBoundingClientRect().height > 1.6 * parseFloat(
                getComputedStyle(e).lineHeight || getComputedStyle(e).fontSize))
            .map(e => e.textContent.trim())"""
    )
    assert not split, f"outputs table headers split mid-word: {split}"


def _shoot(page: Page, name: str) -> None:
    _wait_for_plots(page)
    page.wait_for_timeout(1500)  # let Plotly finish drawing at the new size
    path = SCREENSHOTS / name
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")


def test_phone_layout_is_readable(page: Page):
    """At 390 × 844: tables readable (they scroll sideways, not cut at the screen's edge), CDF
    panel titles apart, chart titles inside their charts with no toolbar over them.
    Screenshot: screenshots/phone-390.png."""
    page.set_viewport_size(PHONE)
    _shoot(page, "phone-390.png")
    _assert_tables_readable(page)
    cdf_titles = [b for b in _boxes(page, "#latency_cdf_plot .annotation-text")]
    assert len(cdf_titles) >= 3, f"CDF panel titles: {cdf_titles}"
    for i, a in enumerate(cdf_titles):
        for b in cdf_titles[i + 1 :]:
            assert not _overlap(a, b), f"CDF titles overlap: {a['text']!r} and {b['text']!r}"
    _assert_titles_inside(page, phone=True)
    for elem_id in ("metrics_table", "outputs_table"):
        scroll = page.locator(f"#{elem_id} .table-container").evaluate(
            "e => getComputedStyle(e).overflowX"
        )
        assert scroll == "auto", f"{elem_id}: cut off at the screen's edge, not scrolled"
        page.locator(f"#{elem_id}").screenshot(path=str(SCREENSHOTS / f"phone-{elem_id}.png"))


def test_desktop_layout_after_a_resize(page: Page):
    """At 1,280 px (after a narrower window): tour step labels whole, the per-step chart's legend
    clear of its ticks, the static timeline's barrier labels inside the chart.
    Screenshot: screenshots/desktop-1280.png."""
    page.set_viewport_size({"width": 900, "height": 800})
    page.wait_for_timeout(800)
    page.set_viewport_size(DESKTOP)
    page.get_by_text("Guided tour: what to look at").click()
    expect(page.locator("#tour_walkthrough")).to_contain_text("batch barrier", timeout=10_000)
    _shoot(page, "desktop-1280.png")
    clipped = page.evaluate(
        """() => Array.from(document.querySelectorAll('#tour_walkthrough button'))
            .filter(b => b.offsetParent !== null)
            .filter(b => b.scrollWidth > b.clientWidth + 1 || b.scrollHeight > b.clientHeight + 1)
            .map(b => b.textContent.trim())"""
    )
    assert not clipped, f"tour step labels clipped: {clipped}"
    legend = _boxes(page, "#step_usage_plot .legend")
    axis_text = ".xaxislayer-above text, [class^='g-x'][class$='title'] text"  # ticks, titles
    ticks = _boxes(page, ", ".join(f"#step_usage_plot {sel}" for sel in axis_text.split(", ")))
    assert legend and ticks, "the per-step chart has no legend or ticks"
    hits = [t["text"] for t in ticks if _overlap(legend[0], t)]
    assert not hits, f"the legend overlaps the x axis: {hits}"
    (svg,) = _boxes(page, "#static_timeline_plot .main-svg")[:1]
    for label in _boxes(page, "#static_timeline_plot .annotation-text"):
        assert label["right"] <= svg["right"] + 1, f"{label['text']!r} leaves the chart: {label}"
    _assert_titles_inside(page)
