"""The model picker in Chromium: ``app.py`` started on a tiny Llama folder, with a tiny Mistral
folder (every layer with an 8-key window, ``tests/family_models.py``) also on the host's
``CBP_MODEL_ALLOWLIST``. The page offers both; each pick loads in the engine process, the model
line names the model's family, size, dtype and folder (its path on hover), each run on it
matches its ``generate``, and the Mistral's run offers its sliding layers in the mask, which
draws the window's band.
"""

from __future__ import annotations

import pytest
from browser_kit import (
    MASK_PLOT,
    PYTESTMARK,
    SCREENSHOTS,
    SUCCESS_STATUS,
    Page,
    expect,
    mask_cells,
    open_session,
    run_and_wait,
    set_requests,
    set_slots,
    status_text,
)
from family_models import WINDOW, save_family_folder
from server_kit import start_app_server

pytestmark = PYTESTMARK
ROWS = [("the quick brown fox jumps over the lazy dog", 6), ("hello", 14)]  # past 8 keys
SLIDING = f"sliding (window {WINDOW})"
LOAD_TIMEOUT_MS = 300_000  # a tiny model's load and warm-up in the engine process


@pytest.fixture(scope="module")
def models(request, tmp_path_factory) -> tuple[str, dict[str, str]]:
    """The page's URL, and the two folders by family: app.py on the Llama, both allowed."""
    root = tmp_path_factory.mktemp("models")
    folders = {family: save_family_folder(family, root / family) for family in ("llama", "mistral")}
    with pytest.MonkeyPatch.context() as patch:  # app.py and its engine process read them
        patch.setenv("CBP_MODEL_ALLOWLIST", ",".join(folders.values()))
        patch.setenv("CBP_ENGINE_KERNEL", "linear")  # no kernel timing at each load
        patch.setenv("CBP_CACHE_DIR", str(root / "cache"))
        url = start_app_server(request, tmp_path_factory, ("--model", folders["llama"]))
    return url, folders


def _pick(page: Page, option: str) -> None:
    """Choose ``option`` in the model picker, as a person would: open it, click the option."""
    page.locator("#model_dropdown input").click()
    page.get_by_role("option", name=option, exact=True).click()
    expect(page.locator("#model_dropdown input")).to_have_value(option)


def _expect_model_line(page: Page, family: str, folder: str) -> None:
    """The model line names ``family`` in words, a size and float32, and reads as the folder's
    name with its full path on hover."""
    line = page.locator("#model_markdown")
    expect(line).to_contain_text(f" · {family} · ", timeout=LOAD_TIMEOUT_MS)
    for words in ("parameters", "float32"):
        expect(line).to_contain_text(words)
    name = line.locator(f'abbr[title^="{folder}"]').first
    expect(name).to_have_text(folder.rstrip("/").rsplit("/", 1)[-1])


def _run_matches(page: Page) -> None:
    run_and_wait(page, LOAD_TIMEOUT_MS)
    assert SUCCESS_STATUS.search(status_text(page)), status_text(page)


def test_the_picker_switches_models_and_the_mask_draws_the_mistrals_window(browser, models):
    """Llama: its line, a run equal to its generate, no sliding layer type. A pick of the
    Mistral: its line, a run equal to its generate, the sliding type whose band appears; a pick
    of the Llama again: its line back."""
    url, folders = models
    page = open_session(browser, url)
    try:
        expect(page.locator("#model_dropdown")).to_be_visible(timeout=30_000)
        _expect_model_line(page, "Llama", folders["llama"])
        set_requests(page, ROWS)
        set_slots(page, 2)
        _run_matches(page)
        radio = page.locator("#mask_layer_radio")
        expect(radio.locator("label").filter(has_text="sliding")).to_have_count(0)

        _pick(page, folders["mistral"])
        _expect_model_line(page, "Mistral", folders["mistral"])
        expect(page.locator("#status_markdown")).to_contain_text("Model ready")
        _run_matches(page)
        choice = radio.locator("label").filter(has_text=SLIDING).first
        expect(choice).to_be_visible(timeout=30_000)
        assert mask_cells(page)["band"] == 0, "a band before the sliding type was picked"
        choice.click()
        subtitle = page.locator(f"{MASK_PLOT} .gtitle-subtitle")
        expect(subtitle).to_contain_text(f"sliding layers, window {WINDOW}", timeout=30_000)
        assert mask_cells(page)["band"] > 0, "no cell drawn outside the Mistral's window"
        page.screenshot(path=str(SCREENSHOTS / "model-picker-mistral.png"), full_page=True)

        _pick(page, folders["llama"])
        _expect_model_line(page, "Llama", folders["llama"])
    finally:
        page.context.close()
