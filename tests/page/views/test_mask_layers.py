"""The packed mask's layer type: the selector is offered only for a run whose model has sliding
windows (a real run of a tiny Mistral, window 8), and choosing one redraws the mask, band drawn."""

from __future__ import annotations

import gradio as gr
import numpy as np
import pytest
from family_models import WINDOW, family_runner
from tiny_model import make_requests

from engine.batching.continuous import ContinuousEngine
from engine.batching.static import StaticEngine
from engine.config import EngineConfig
from engine.page.handlers import playground, recording
from engine.page.panels.results_panel import results_panel
from engine.page.views import run_view
from engine.page.views.run_view import RunState

SLIDING = f"sliding (window {WINDOW})"
SPECS = [("the quick brown fox jumps over the lazy dog", 6), ("hello", 14)]  # past 8 keys


@pytest.fixture(scope="module")
def mistral() -> RunState:
    """Both engines' runs of two requests on a tiny Mistral, every layer with an 8-key window."""
    runner = family_runner("mistral")
    requests = make_requests(SPECS)
    static = StaticEngine(runner, EngineConfig(2)).run(requests)
    return RunState(static, ContinuousEngine(runner, EngineConfig(2)).run(requests), None)


@pytest.fixture(scope="module")
def recorded() -> RunState:
    """The shipped recording (the embedded SmolLM2: every layer global)."""
    shown = recording.opening_result()
    if shown is None:
        pytest.skip("no recording ships")
    return shown.state


def _radio(state: RunState) -> gr.Radio:
    shown = run_view.render(state, downloads=False).as_outputs()
    outputs = dict(zip(run_view.RUN_OUTPUTS, shown, strict=True))
    return outputs["mask_layer_radio"]


def test_selector_is_shown_only_for_a_run_with_sliding_windows(mistral, recorded):
    """A run on a windowed model shows the selector with "global" and its window, "global"
    chosen; the embedded model's run hides it."""
    assert mistral.continuous.info["sliding_windows"] == [WINDOW], mistral.continuous.info
    radio = _radio(mistral)
    assert radio.visible is True, "the selector is hidden for a model with a sliding window"
    assert [label for label, _ in radio.choices] == ["global", SLIDING], radio.choices
    assert radio.value == "global", radio.value
    assert not recorded.continuous.info.get("sliding_windows"), "the recording has windows"
    assert _radio(recorded).visible is False, "the selector shows for an all-global model"


def test_panel_opens_with_the_selector_only_for_a_windowed_run(mistral, recorded):
    """The results panel built on a shown run offers the layer types only where it has windows."""
    for state, shown in ((mistral, True), (recorded, False)):
        with gr.Blocks():
            panel = results_panel(run_view.render(state, downloads=False))
        assert panel.mask_layer_radio.visible is shown, f"selector visible: not {shown}"


def test_choosing_the_sliding_layers_redraws_the_mask_with_its_band(mistral):
    """update_step with "sliding (window 8)" draws the packed mask at that step with the keys
    more than 7 back in the band; "global" draws none; the other views are unchanged."""
    step = len(mistral.continuous.steps) - 1  # the long request's last decode: 18+ keys
    index = run_view.STEP_VIEW_OUTPUTS.index("packed_mask_plot")
    sliding = playground.update_step(mistral, step, "time", SLIDING)
    plain = playground.update_step(mistral, step, "time", "global")
    z_sliding, z_plain = (np.asarray(views[index].data[0].z) for views in (sliding, plain))
    band = 2 * len(mistral.continuous.steps[step].seqs)
    num_keys = z_plain.shape[1]
    assert np.sum(z_sliding == band) == num_keys - WINDOW, "not every key past the window hidden"
    assert not np.any(z_plain == band), "the global layers' mask has a band"
    assert "sliding layers, window 8" in sliding[index].layout.title.subtitle.text
    assert "global layers" in plain[index].layout.title.subtitle.text
    others = [i for i in range(len(sliding)) if i != index and sliding[i] is not None]
    assert all(sliding[i].to_json() == plain[i].to_json() for i in others), "other views changed"


def test_mask_layer_is_wired_like_the_step_slider():
    """app.py redraws the step views on a layer pick, keeping the pick in a state that the step
    and x-axis redraws read: their API inputs stay the step and the x-axis."""
    import app

    demo = app.build_demo("Model: test")
    by_api = {fn.api_name: fn for fn in demo.fns.values()}
    (picked,) = [fn for fn in demo.fns.values() if fn.fn is playground.layer_event]
    assert picked.inputs[-1].elem_id == "mask_layer_radio", "a pick does not read the selector"
    kept = picked.outputs[0]
    assert isinstance(kept, gr.State), f"the pick is kept in {kept}"
    assert [c.elem_id for c in picked.outputs[1:]] == list(run_view.STEP_VIEW_OUTPUTS)
    for name in ("step", "x_axis"):
        fn = by_api[name]
        assert fn.fn is playground.update_step, f"{name} wired to {fn.fn}"
        assert fn.inputs[-1] is kept, f"{name} does not read the kept layer type"
        assert [c.elem_id for c in fn.outputs] == list(run_view.STEP_VIEW_OUTPUTS), name
