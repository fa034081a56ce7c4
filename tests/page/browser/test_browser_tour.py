"""The guided tour in the browser, and the README's screenshot."""

from __future__ import annotations

import os
import re

import pytest
from browser_kit import (
    PYTESTMARK,
    Page,
    expect,
)

pytestmark = PYTESTMARK


# --- guided tour and the README's screenshot ------------------------------------------------------


def test_guided_tour_steps_point_at_live_charts(page: Page):
    """The tour opens, moves between its steps, and each step links to a chart on the page."""
    page.get_by_text("Guided tour: what to look at").click()
    tour = page.locator("#tour_walkthrough")
    expect(tour).to_contain_text("batch barrier", timeout=10_000)
    link = tour.locator('a[href="#static_timeline_plot"]')
    expect(link).to_be_visible()
    page.locator("#tour_next_1").click()
    expect(tour).to_contain_text("schedules every step", timeout=10_000)
    expect(tour.locator('a[href="#continuous_timeline_plot"]')).to_be_visible()
    assert page.locator("#continuous_timeline_plot").count() == 1


def test_a_tour_steps_setup_link_sets_the_page_up(page: Page):
    """A step's link to hand out opens the page set up for it, in a new tab: the
    chunked-prefill step's long prompts at 2 slots with a token budget of 64 (issue 51, item 10)."""
    page.get_by_text("Guided tour: what to look at").click()
    tour = page.locator("#tour_walkthrough")
    for number in range(1, 4):  # to step 4, chunked prefill
        page.locator(f"#tour_next_{number}").click()
    expect(tour).to_contain_text("token budget", timeout=10_000)
    with page.context.expect_page(timeout=10_000) as opened:  # Gradio opens links in a tab
        tour.get_by_role("link", name="this step's link").filter(visible=True).click()
    shown = opened.value
    expect(shown.locator("#preset_dropdown input")).to_have_value("Long prompts", timeout=30_000)
    expect(shown.locator("#slots_slider input[type=range]")).to_have_value("2")
    shown.get_by_text("Engine settings", exact=True).click()
    expect(shown.locator("#token_budget_number input")).to_have_value("64", timeout=10_000)
    shown.close()


def test_a_tour_steps_button_sets_the_page_up_in_place(page: Page):
    """One click on step 4's "Set this up" sets this page up for chunked prefill (long prompts,
    2 slots, token budget 64) and says to press Run, starting none; then step 6's sets prefix
    caching on, 4 slots, and puts the token budget back to none (issue 51, item 10)."""
    page.get_by_text("Guided tour: what to look at").click()
    tour = page.locator("#tour_walkthrough")
    for number in range(1, 4):  # to step 4, chunked prefill
        page.locator(f"#tour_next_{number}").click()
    page.locator("#tour_setup_4").click()
    expect(page.locator("#tour_note_4")).to_contain_text("Press Run to measure it", timeout=30_000)
    expect(page.locator("#preset_dropdown input")).to_have_value("Long prompts")
    expect(page.locator("#slots_slider input[type=range]")).to_have_value("2")
    page.get_by_text("Engine settings", exact=True).click()
    budget = page.locator("#token_budget_number input")
    expect(budget).to_have_value("64", timeout=10_000)
    expect(page.locator("#status_markdown")).not_to_contain_text("Running")  # nothing started
    for number in (4, 5):  # to step 6, prefix caching
        page.locator(f"#tour_next_{number}").click()
    expect(tour).to_contain_text("system prompt", timeout=10_000)
    page.locator("#tour_setup_6").click()
    expect(page.locator("#tour_note_6")).to_contain_text("Prefix caching on", timeout=30_000)
    expect(page.locator("#prefix_caching_checkbox input[type=checkbox]")).to_be_checked()
    expect(page.locator("#preset_dropdown input")).to_have_value("Shared system prompt")
    expect(page.locator("#slots_slider input[type=range]")).to_have_value("4")
    expect(budget).to_have_value("0")  # step 4's budget is not left behind


# Each step button of the tour: its text, the number's colour and height, and the button's width.
STEP_BUTTONS_JS = """els => els.map(e => {
    const number = e.querySelector('.step-number');
    const style = getComputedStyle(number);
    return {text: number.textContent.trim(), color: style.color,
            height: number.getBoundingClientRect().height, width: e.getBoundingClientRect().width,
            svg: !!number.querySelector('svg')};
})"""


def test_tour_on_a_phone_names_the_step_once_and_numbers_its_bars(page: Page):
    """On a phone (390 px) the tour's header names the step once ("Step 1/7: Padding and the
    barrier") and every step bar shows its number (or a tick) in a visible colour, side by side
    within the screen."""
    page.set_viewport_size({"width": 390, "height": 844})
    page.get_by_text("Guided tour: what to look at").click()
    tour = page.locator("#tour_walkthrough")
    expect(tour).to_have_class(re.compile(r"\bcompact\b"), timeout=10_000)
    expect(tour.locator(".step-title")).to_have_text(
        re.compile(r"^\s*Step 1/7:\s*Padding and the barrier\s*$")
    )
    page.locator("#tour_next_1").click()
    expect(tour.locator(".step-title")).to_contain_text("Step 2/7: Iteration-level", timeout=10_000)
    buttons = tour.locator(".step-button").evaluate_all(STEP_BUTTONS_JS)
    assert len(buttons) == 7, buttons
    for i, button in enumerate(buttons, start=1):
        shown = button["svg"] or button["text"] == str(i)  # a visited step shows a tick
        assert shown, f"bar {i} shows neither its number nor a tick: {button}"
        clear = re.fullmatch(r"rgba\(.*,\s*0\)|transparent", button["color"])
        assert not clear, f"bar {i}'s number is transparent: {button}"
        assert button["height"] >= 14, f"bar {i} is too thin for its number: {button}"
    assert sum(b["width"] for b in buttons) <= 390, f"the bars run off the screen: {buttons}"


@pytest.mark.skipif(
    not os.environ.get("CBP_SCREENSHOT"), reason="set CBP_SCREENSHOT to the PNG path to write"
)
def test_readme_screenshot(page: Page):
    """The README's picture: the article's six requests, paged KV at 16 MiB (one preemption)."""
    page.get_by_text("Engine settings", exact=True).click()
    budget = page.locator("#kv_budget_number input")
    expect(budget).to_be_visible()
    for _ in range(5):  # the accordion may still be rendering its contents: fill until it sticks
        budget.fill("16")
        budget.press("Tab")
        page.wait_for_timeout(300)
        if budget.input_value() == "16":
            break
    expect(budget).to_have_value("16")
    page.locator("#reference_checkbox input[type=checkbox]").uncheck()
    page.locator("#run_button").click()
    status = page.locator("#status_markdown")
    expect(status).to_contain_text("Running", timeout=60_000)
    expect(status).to_contain_text("speedup", timeout=600_000)
    expect(status).not_to_contain_text("Recorded run")
    expect(page.locator("#block_map_plot .gtitle")).to_contain_text("KV block map")
    expect(page.locator("#block_map_plot")).to_contain_text("/22 blocks in use")  # 16 MiB
    page.wait_for_timeout(2000)  # let Plotly finish drawing
    page.screenshot(path=os.environ["CBP_SCREENSHOT"], full_page=True)
