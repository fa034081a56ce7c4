"""The packed mask's layer types in Chromium: on a page showing a run of a model with a sliding
window, the "Layers" selector is there, explains each type on hover, and picking the sliding type
draws the window's band (the keys it hides, light grey) into the packed mask.

The page is ``app.build_demo``, served in this process, opening on a real run of a tiny Mistral
(every layer with an 8-key window, ``tests/family_models.py``) in place of the shipped recording:
the selector and the step views need the run only, not a model serving it.
"""

from __future__ import annotations

import pytest
from browser_kit import MASK_PLOT as PLOT
from browser_kit import PYTESTMARK, SCREENSHOTS, mask_cells, open_session
from family_models import WINDOW, family_runner
from tiny_model import make_requests

from engine.batching.continuous import ContinuousEngine
from engine.batching.static import StaticEngine
from engine.config import EngineConfig
from engine.page.handlers import recording
from engine.page.host import launch
from engine.page.panels.results_panel import LAYER_HELP
from engine.page.views import run_view
from engine.peers.server_process import free_port

try:
    from playwright.sync_api import Page, expect
except ImportError:
    Page = expect = None

pytestmark = PYTESTMARK
SLIDING = f"sliding (window {WINDOW})"
SPECS = [("the quick brown fox jumps over the lazy dog", 6), ("hello", 14)]  # past 8 keys


@pytest.fixture(scope="module")
def windowed_url(monkeypatch_module):
    """The page opening on a tiny Mistral's run, served here on a free port."""
    import app

    runner = family_runner("mistral")
    requests = make_requests(SPECS)
    static = StaticEngine(runner, EngineConfig(2)).run(requests)
    state = run_view.RunState(static, ContinuousEngine(runner, EngineConfig(2)).run(requests), None)
    shown = run_view.render(state, downloads=False)
    monkeypatch_module.setattr(recording, "opening_result", lambda *_, **__: shown)
    demo = app.build_demo("Model: tiny Mistral")
    port = free_port()
    demo.launch(
        server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, **launch.page_assets()
    )
    yield f"http://127.0.0.1:{port}/"
    demo.close()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_sliding_layers_draw_the_window_band(browser, windowed_url):
    """The selector shows "global" chosen and the run's window, each with its hover text; picking
    the sliding type redraws the packed mask with light-grey cells outside the window, and
    picking "global" again takes them away."""
    page = open_session(browser, windowed_url)
    try:
        radio = page.locator("#mask_layer_radio")
        expect(radio).to_be_visible(timeout=30_000)
        expect(page.locator(PLOT)).to_have_count(1, timeout=30_000)
        for label in ("global", SLIDING):
            choice = radio.locator("label").filter(has_text=label).first
            help_text = LAYER_HELP[label.split(" ")[0]]
            expect(choice).to_have_attribute("title", help_text, timeout=10_000)
        before = mask_cells(page)
        assert before["band"] == 0 and "global layers" in before["subtitle"], before
        radio.locator("label").filter(has_text=SLIDING).first.click()
        expect(page.locator(f"{PLOT} .gtitle-subtitle")).to_contain_text(
            f"sliding layers, window {WINDOW}", timeout=30_000
        )
        after = mask_cells(page)
        assert after["band"] > 0, f"no cell drawn outside the window: {after}"
        assert after["drawn"] == before["drawn"], "the band does not fill the hidden causal cells"
        page.locator(PLOT).screenshot(path=str(SCREENSHOTS / "mask-sliding-window.png"))
        radio.locator("label").filter(has_text="global").first.click()
        expect(page.locator(f"{PLOT} .gtitle-subtitle")).to_contain_text(
            "global layers", timeout=30_000
        )
        assert mask_cells(page)["band"] == 0, "the band stays after picking global layers"
    finally:
        page.context.close()
