"""The model line: a readable name, the family in words, the sliding window, the decode step and
the precision of the run shown, on tiny real models (no weights, no browser)."""

from __future__ import annotations

import dataclasses
import html
import re

import pytest
from family_models import WINDOW, family_runner
from page_runs import run_and_render
from tiny_model import tiny_runner

from engine.fidelity.reference import ReferenceCache
from engine.page.handlers import model_choice
from engine.page.run import shared_model
from engine.page.run.run_options import RunOptions
from engine.page.run.shared_model import PageModel, local_model
from engine.worker.worker_model import WorkerModel

ROWS = [["hello world", 6], ["abc", 9]]


def _shared(runner) -> PageModel:
    return local_model(WorkerModel(runner.loaded, runner, ReferenceCache(runner)))


def _shown(line: str) -> str:
    """The line as read on the page: hover texts dropped, entities unescaped."""
    return html.unescape(re.sub(r"<[^>]+>", "", line))


@pytest.fixture(scope="module")
def gemma() -> PageModel:
    """The tiny Gemma 3 (2 sliding layers of ``WINDOW`` keys, then a global one), its fused
    layers made as a warm-up makes them."""
    runner = family_runner("gemma3")
    assert runner.fused_decoder is not None, "the tiny Gemma 3 has no fused layers"
    return _shared(runner)


@pytest.fixture(scope="module")
def llama() -> PageModel:
    """A tiny Llama of this module's own (its bfloat16 copy is kept between tests)."""
    return _shared(tiny_runner())


def test_gemma_line_names_the_family_the_window_and_the_decode_step(gemma):
    """model_type gemma3_text reads "Gemma 3"; the window is said with how many layers have it;
    the decode step is where the fused layers ran it (the bench JSON's ``layers_step``)."""
    shown = _shown(gemma.label_markdown)
    assert gemma.loaded.config.model_type == "gemma3_text"
    assert " · Gemma 3 · " in shown and "gemma3_text" not in shown, shown
    assert f" · sliding window {WINDOW} on 2 of 3 layers · " in shown, shown
    step = gemma.worker.model.runner.layers_step
    assert step == gemma.facts.decode_step and step is not None, step
    said = "decode step: C++" if step == "C++" else "decode step: Python"
    assert f" · {said} · " in shown, shown


def test_a_model_without_a_window_says_none(llama):
    """A Llama's line has no window, and its family in words."""
    shown = _shown(llama.label_markdown)
    assert " · Llama · " in shown and "sliding window" not in shown, shown


def test_a_gguf_path_shows_its_stem_with_the_full_path_on_hover(llama, tmp_path):
    """A model named by a .gguf path reads as the file's stem; its full path and the weights'
    cache folder are on hover, not in the line."""
    path = tmp_path / "g270" / "gemma-3-270m-q4_k_m.gguf"
    path.parent.mkdir()
    path.write_bytes(b"GGUF")
    cache = "/root/.cache/cb-playground/gemma-3-270m-q4_k_m-0123abcd"
    card = dataclasses.replace(llama.facts.card, name=str(path), source=cache)
    line = PageModel(facts=dataclasses.replace(llama.facts, card=card)).label_markdown
    shown = _shown(line)
    assert shown.startswith("Model: gemma-3-270m-q4_k_m · runs on CPU · float32 · "), shown
    assert str(path) not in shown and cache not in shown, shown
    assert line.startswith(f'Model: <abbr title="{path} (weights: {cache})">'), line


def test_after_a_bfloat16_run_the_line_names_bfloat16(llama, monkeypatch):
    """The line drawn after a bfloat16 Run names bfloat16, as the status line does, and no
    float32; after a float32 Run, float32 again."""
    monkeypatch.setattr(shared_model, "_shared_model", llama)
    result = run_and_render(ROWS, 2, RunOptions(dtype="bfloat16"), llama)
    assert result.status.startswith("**bfloat16** · "), result.status
    shown = _shown(model_choice.run_model_line(result.state, None))
    assert " · runs on CPU · bfloat16 · " in shown and "float32" not in shown, shown
    result = run_and_render(ROWS, 2, RunOptions(), llama)
    shown = _shown(model_choice.run_model_line(result.state, ""))
    assert " · runs on CPU · float32 · " in shown and "bfloat16" not in shown, shown


def test_a_run_in_a_precision_not_held_says_both(llama):
    """Where the run's precision has no copy here, the line says the loaded one and the run's."""
    fresh = PageModel(facts=llama.facts)
    shown = _shown(fresh.run_label_markdown("bfloat16"))
    assert " · runs on CPU · loaded in float32 · this run bfloat16 · " in shown, shown


def test_the_page_redraws_the_model_line_after_each_run():
    """Run and "Run live anyway" are each followed by ``run_model_line`` into the model line,
    with the run state and the model picker as inputs."""
    import app

    demo = app.build_demo("Model: test")
    line = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "model_markdown")
    found = [f for f in demo.fns.values() if f.fn is model_choice.run_model_line]
    assert len(found) == 2, f"{len(found)} redraws of the model line after a run"
    for fn in found:
        assert [b._id for b in fn.outputs] == [line._id], "it draws elsewhere"
        assert [getattr(b, "elem_id", None) for b in fn.inputs][1] == "model_dropdown"
