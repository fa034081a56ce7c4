"""What the page looks like on a phone (390 × 844) and at 1,280 × 720, measured in the browser:
whole headers and caps in the request table, every prefill bar and line label in the per-step
chart, barrier labels apart, the KV-cache dropdown's text whole, the title in one font.

Screenshots go to ``screenshots/`` at the repository's root (gitignored), for a person to look at.
"""

from __future__ import annotations

import re

import pytest
from browser_kit import (
    PLOT_IDS,
    PYTESTMARK,
    SCREENSHOTS,
    Page,
    expect,
    run_and_wait,
    set_requests,
    set_slots,
)

from engine.knobs import KNOB

pytestmark = PYTESTMARK

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 720}
SIZES = pytest.mark.parametrize("size", [PHONE, DESKTOP], ids=["phone", "desktop"])

# Text that does not fit its box: the element's text, its scroll and client widths.
CLIPPED_JS = """els => els.filter(e => e.scrollWidth > e.clientWidth + 1)
    .map(e => [e.textContent.trim(), e.scrollWidth, e.clientWidth])"""


def _shoot(page: Page, elem_id: str, size: dict) -> None:
    name = f"look-{size['width']}-{elem_id}.png"
    page.locator(f"#{elem_id}").screenshot(path=str(SCREENSHOTS / name))
    print(f"screenshot: {SCREENSHOTS / name}")


@SIZES
def test_request_table_shows_whole_headers_and_caps(page: Page, size: dict):
    """No header of the request table is cut ("m." for max_new_tokens) and the caps 300 and 180
    show whole (not "3…"): on a phone the table scrolls sideways instead."""
    page.set_viewport_size(size)
    page.wait_for_timeout(500)
    headers = page.locator("#requests_table th span")
    expect(headers.first).to_be_visible()
    clipped = headers.evaluate_all(CLIPPED_JS)
    assert not clipped, f"headers cut (text, needed px, shown px): {clipped}"
    caps = page.locator('#requests_table [data-testid^="cell-"][data-testid$="-1"] span')
    assert {"300", "180"} <= set(caps.all_inner_texts()), caps.all_inner_texts()
    clipped = caps.evaluate_all(CLIPPED_JS)
    assert not clipped, f"caps cut (text, needed px, shown px): {clipped}"
    _shoot(page, "requests_table", size)


# Each metrics header: its text, its right edge and the table's visible right edge (px), and
# whether its longest word fits its column (no word split by overflow-wrap).
METRICS_HEADERS_JS = """ths => {
    const view = ths[0].closest('.virtual-table-viewport').getBoundingClientRect();
    const ctx = document.createElement('canvas').getContext('2d');
    return ths.map(th => {
        const text = th.querySelector('.header') || th;
        ctx.font = getComputedStyle(text).font;
        const words = th.innerText.trim().split(/\\s+/);
        const word = Math.max(...words.map(w => ctx.measureText(w).width));
        const room = text.getBoundingClientRect().width;
        return [th.innerText.trim(), th.getBoundingClientRect().right, view.right, word <= room];
    });
}"""


def test_metrics_table_shows_every_column_whole_at_1400_px(page: Page):
    """At 1,400 × 1,000 every metrics column shows whole, the last ("prefix-cache hit rate %")
    within the table's right edge where it was cut, and no header's word is split."""
    page.set_viewport_size({"width": 1400, "height": 1000})
    headers = page.locator("#metrics_table th")
    expect(headers.first).to_be_visible(timeout=30_000)
    page.wait_for_timeout(500)
    shown = headers.evaluate_all(METRICS_HEADERS_JS)
    cut = [(name, right, edge) for name, right, edge, _ in shown if right > edge + 1]
    assert not cut, f"columns past the table's edge (name, right px, edge px): {cut}"
    split = [name for name, _, _, whole in shown if not whole]
    assert not split, f"headers whose longest word does not fit its column: {split}"
    _shoot(page, "metrics_table", {"width": 1400})


PHONE_CHART_PX = 324  # a chart's width on a 390-px phone, as the page lays it out


def test_server_chart_titles_show_whole_on_a_phone(browser):
    """The servers' charts, drawn as wide as a phone shows a chart, keep their titles within it:
    "Servers' /metrics: …" ran past the right edge (issue 51, item 11)."""
    from engine.page.figures import server_lanes

    page = browser.new_page(viewport=PHONE)
    for fig in (server_lanes.server_chart_figure({}), server_lanes.server_timeline_figure({})):
        width = f"{PHONE_CHART_PX}px"
        page.set_content(fig.to_html(include_plotlyjs=True, default_width=width))
        title = page.locator(".gtitle")
        expect(title).to_be_visible(timeout=30_000)
        right = title.evaluate("t => t.getBoundingClientRect().right")
        edge = page.locator(".main-svg").first.evaluate("s => s.getBoundingClientRect().right")
        assert right <= edge, f"{title.text_content()!r} ends at {right:.0f} px, past {edge:.0f}"
    page.close()


# Each drawn prefill bar of the per-step chart: how wide it shows (its box plus its outline), px.
PREFILL_BARS_JS = """plot => {
    const [trace] = Array.from(plot.querySelectorAll('.barlayer .trace.bars'))
        .filter(g => g.__data__[0].trace.name === 'prefill tokens');  // Plotly's calcdata
    const bars = trace.querySelectorAll('path');
    return Array.from(bars).filter(p => p.getBoundingClientRect().height > 0)  // no prefill: flat
        .map(p => p.getBoundingClientRect().width + parseFloat(getComputedStyle(p).strokeWidth));
}"""


@SIZES
def test_every_prefill_bar_of_the_step_chart_shows(page: Page, size: dict):
    """The per-step chart draws every step with a prefill (the recorded run: 4 of 300 steps) at
    least 2 px wide, also on a phone where a step is under a pixel."""
    page.set_viewport_size(size)
    plot = page.locator("#step_usage_plot .js-plotly-plot")
    expect(plot).to_have_count(1, timeout=60_000)
    page.wait_for_timeout(1500)  # Plotly redraws at the new size
    num_prefill = plot.evaluate("el => el.data[0].y.filter(y => y > 0).length")
    assert num_prefill >= 3, f"the recorded run has {num_prefill} prefill steps"
    widths = plot.evaluate(PREFILL_BARS_JS)
    shown = [w for w in widths if w >= 2]
    assert len(shown) == num_prefill, f"{num_prefill} prefill steps, bars shown px: {widths}"
    _shoot(page, "step_usage_plot", size)


# Each annotation of a plot: its text and box, and the plot area's left and right (page px).
ANNOTATIONS_JS = """plot => {
    const svg = plot.querySelector('.main-svg').getBoundingClientRect();
    const size = plot._fullLayout._size;  // Plotly's plot area, px from the svg's corner
    return Array.from(plot.querySelectorAll('.annotation')).map(e => {
        const r = e.getBoundingClientRect();
        return {text: e.textContent, left: r.left, right: r.right,
                areaLeft: svg.left + size.l, areaRight: svg.left + size.l + size.w};
    });
}"""


@SIZES
def test_step_chart_labels_stay_within_the_plot(page: Page, size: dict):
    """The per-step chart's line labels ("the whole pool, 100 %", the token budget) lie within
    the plot area, also on a phone (issue 27: the pool's label ran past the left edge)."""
    page.set_viewport_size(size)
    plot = page.locator("#step_usage_plot .js-plotly-plot")
    expect(plot).to_have_count(1, timeout=60_000)
    page.wait_for_timeout(1500)  # Plotly redraws at the new size
    labels = plot.evaluate(ANNOTATIONS_JS)
    assert any("the whole pool" in label["text"] for label in labels), labels
    outside = [
        label
        for label in labels
        if label["left"] < label["areaLeft"] - 1 or label["right"] > label["areaRight"] + 1
    ]
    assert not outside, f"{size['width']} px: labels past the plot area: {outside}"
    _shoot(page, "step_usage_plot", size)


@SIZES
def test_kv_cache_dropdown_shows_each_choice_whole(page: Page, size: dict):
    """Every choice of the continuous engine's KV cache fits the dropdown's box."""
    page.set_viewport_size(size)
    page.get_by_text("Engine settings", exact=True).click()
    box = page.locator("#kv_mode_dropdown input")
    expect(box).to_be_visible()
    clipped = box.evaluate(
        """(input, labels) => labels.filter(label => {
            input.value = label;  // measured only: no input event, the page's value stays
            return input.scrollWidth > input.clientWidth + 1;
        })""",
        [label for label, _ in KNOB["kv_mode"].labels],
    )
    assert not clipped, f"choices cut in the dropdown: {clipped}"
    _shoot(page, "kv_mode_dropdown", size)


# Characters of ``text`` whose width differs between two fallbacks: the page's font lacks them.
MISSING_GLYPHS_JS = """async ([text, weight]) => {
    const family = getComputedStyle(document.querySelector('h1')).fontFamily.split(',')[0];
    await document.fonts.load(`${weight} 48px ${family}`, text);
    const canvas = document.createElement('canvas').getContext('2d');
    const width = (fallback, ch) => {
        canvas.font = `${weight} 48px ${family}, ${fallback}`;
        return canvas.measureText(ch).width;
    };
    return Array.from(new Set(text)).filter(ch => width('monospace', ch) !== width('serif', ch));
}"""


def test_title_is_set_in_one_font(page: Page):
    """The title's font (and weight) has every letter and digit, so no letter of it (the "B" of
    "Batching") is drawn in a fallback font."""
    title = page.locator("h1").first
    expect(title).to_have_text("Continuous Batching Playground")
    weight = title.evaluate("e => getComputedStyle(e).fontWeight")
    text = title.inner_text() + "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    missing = page.evaluate(MISSING_GLYPHS_JS, [text, weight])
    assert not missing, f"drawn in a fallback font at weight {weight}: {missing}"


def _drawn_fonts(page: Page, selector: str, text: str | None = None) -> list[set[str]]:
    """The fonts Chromium drew the text of each element matching ``selector`` in (its family
    names; only elements whose whole text is ``text``, if given), as DevTools records them."""
    devtools = page.context.new_cdp_session(page)
    devtools.send("DOM.enable")
    devtools.send("CSS.enable")
    root = devtools.send("DOM.getDocument", {"depth": -1})["root"]["nodeId"]
    nodes = devtools.send("DOM.querySelectorAll", {"nodeId": root, "selector": selector})
    fonts = []
    for node in nodes["nodeIds"]:
        html = devtools.send("DOM.getOuterHTML", {"nodeId": node})["outerHTML"]
        if text is not None and re.sub(r"<[^>]*>", "", html).strip() != text:
            continue
        used = devtools.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]
        fonts.append({font["familyName"] for font in used})
    devtools.detach()
    return fonts


def test_tables_draw_the_check_mark_as_the_status_line_does(page: Page):
    """The metrics and outputs tables draw "✓" in a font the status line's text is drawn in: the
    tables' monospace font, IBM Plex Mono, draws it as "√"."""
    status = page.locator("#status_markdown [data-testid=markdown]")
    expect(status).to_contain_text("✓", timeout=30_000)  # the recorded run's verdict
    page_fonts = set().union(*_drawn_fonts(page, "#status_markdown [data-testid=markdown] p"))
    for elem_id in ("metrics_table", "outputs_table"):
        cells = f'#{elem_id} [role=grid] [data-testid^="cell-"] .cell-wrap'
        expect(page.locator(cells, has_text="✓").first).to_be_visible()
        page.evaluate("() => document.fonts.ready.then(() => true)")  # web fonts it asked for
        drawn = _drawn_fonts(page, cells, "✓")
        assert drawn, f"{elem_id}: no cell shows ✓ alone (the recorded run's verdict)"
        for families in drawn:
            assert families <= page_fonts, (
                f"{elem_id}: ✓ drawn in {families}, the status line's text in {page_fonts}"
            )


# A plot's title and subtitle boxes and its plot area's top, in px from the figure's top edge.
TITLE_BOXES_JS = """plot => {
    const top = plot.querySelector('.main-svg').getBoundingClientRect().top;
    const box = sel => { const e = plot.querySelector(sel); if (!e) return null;
        const r = e.getBoundingClientRect(); return {top: r.top - top, bottom: r.bottom - top}; };
    return {title: box('.gtitle'), subtitle: box('.gtitle-subtitle'),
            area: plot._fullLayout._size.t};
}"""


@SIZES
def test_mask_titles_align_and_no_subtitle_runs_into_its_chart(page: Page, size: dict):
    """The packed and the static mask's titles (side by side; their subtitles differ in length)
    sit at one height, and every chart's subtitle ends above its plot area."""
    page.set_viewport_size(size)
    boxes = {}
    for elem_id in PLOT_IDS:
        plot = page.locator(f"#{elem_id} .js-plotly-plot")
        expect(plot).to_have_count(1, timeout=60_000)
        page.wait_for_timeout(300)
        boxes[elem_id] = plot.evaluate(TITLE_BOXES_JS)
    packed, static = boxes["packed_mask_plot"]["title"], boxes["static_mask_plot"]["title"]
    assert abs(packed["top"] - static["top"]) <= 1, f"mask titles at {packed} and {static}"
    for elem_id, box in boxes.items():
        below = box["subtitle"] or box["title"]
        assert below["bottom"] <= box["area"] + 1, f"{elem_id}: its title runs into it: {box}"
    _shoot(page, "packed_mask_plot", size)
    _shoot(page, "static_mask_plot", size)


# The KV block map's labels: text, box, whether shown, and the width of one block (px).
BLOCK_LABELS_JS = """plot => {
    const trace = plot.data[0];
    const block = plot._fullLayout.xaxis._length / trace.z[0].length - (trace.xgap || 0);
    return Array.from(plot.querySelectorAll('g.heatmap-label text')).map(e => {
        const r = e.getBoundingClientRect();
        return {text: e.textContent, left: r.left, right: r.right, top: r.top, block,
                shown: getComputedStyle(e).visibility !== 'hidden'};
    });
}"""


@SIZES
def test_kv_block_labels_fit_their_blocks(page: Page, size: dict):
    """The KV block map's labels ("R0" ... "R5" on the recorded run) are shown, each within its
    block and apart from its neighbours, on a phone as at 1,280 px; none would be "R1R2R3"."""
    page.set_viewport_size(size)
    plot = page.locator("#block_map_plot .js-plotly-plot")
    expect(plot).to_have_count(1, timeout=60_000)
    page.wait_for_timeout(1500)  # Plotly redraws at the new size; page.js measures the labels
    labels = plot.evaluate(BLOCK_LABELS_JS)
    shown = [label for label in labels if label["shown"] and label["text"]]
    assert shown, f"{size['width']} px: no block label shown: {labels}"
    for label in shown:
        width = label["right"] - label["left"]
        assert width <= label["block"], f"{size['width']} px: wider than its block: {label}"
    rows = {}
    for label in shown:
        rows.setdefault(round(label["top"]), []).append(label)
    for row in rows.values():
        row.sort(key=lambda label: label["left"])
        for a, b in zip(row, row[1:], strict=False):
            assert a["right"] <= b["left"], f"{size['width']} px: labels run together: {a}, {b}"
    _shoot(page, "block_map_plot", size)


def test_barrier_labels_on_the_static_timeline_stay_apart(page: Page):
    """Four requests on one slot (caps 20, 2, 20, 10): two barriers two steps apart; their
    labels, on a phone and at 1,280 px, neither overlap nor leave the chart."""
    rows = [("Look test one", 20), ("Look test two", 2), ("Look test three", 20)]
    set_requests(page, [*rows, ("Look test four", 10)])  # a setup no other test runs: run live
    set_slots(page, 1)
    run_and_wait(page)
    for size in (PHONE, DESKTOP):
        page.set_viewport_size(size)
        page.wait_for_timeout(1500)  # Plotly redraws at the new size
        labels = page.locator("#static_timeline_plot .annotation").evaluate_all(
            """els => els.map(e => {
                const r = e.getBoundingClientRect();
                return {left: r.left, right: r.right, top: r.top, bottom: r.bottom,
                        text: e.textContent};
            })"""
        )
        barriers = [b for b in labels if b["text"] == "barrier"]
        assert len(barriers) >= 2, f"{size['width']} px: barrier labels {labels}"
        (svg,) = page.locator("#static_timeline_plot .main-svg").first.evaluate_all(
            "els => els.map(e => e.getBoundingClientRect().toJSON())"
        )
        for label in barriers:
            inside = svg["left"] - 1 <= label["left"] and label["right"] <= svg["right"] + 1
            assert inside, f"{size['width']} px: a barrier label leaves the chart: {label}"
        for i, a in enumerate(barriers):
            for b in barriers[i + 1 :]:
                apart = (
                    a["right"] <= b["left"]
                    or b["right"] <= a["left"]
                    or a["bottom"] <= b["top"]
                    or b["bottom"] <= a["top"]
                )
                assert apart, f"{size['width']} px: barrier labels overlap: {a} and {b}"
        _shoot(page, "static_timeline_plot", size)
