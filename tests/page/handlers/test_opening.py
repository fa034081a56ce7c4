"""A page opened from a setup link: its setup's recent run, or the recorded run said to be
another setup's.

The page opens on the recorded run of the article's six requests. After a link set up another
setup, ``opening.link_opened`` shows a run of that very setup measured here within the replay
window, labelled as a run shown at once; else it keeps the recorded run and says over the results
whose run it is, and that Run measures the linked setup.
"""

from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace

import gradio as gr
import pytest
from tiny_model import tiny_runner

from engine.fidelity.reference import ReferenceCache
from engine.page.handlers import opening, playground, recording
from engine.page.run import shared_model
from engine.page.run.run_handle import RunHandle
from engine.page.run.run_options import RUN_INPUTS, RunSettings
from engine.page.run.shared_model import PageModel, local_model
from engine.page.views import run_view
from engine.page.views.run_view import RUN_OUTPUTS
from engine.worker.worker_model import WorkerModel

ROWS = [["hello world", 6], ["abc", 9]]
LINKED = "One long, many short"  # the preset the link named (its table stands in as ROWS)
OUT = {name: i for i, name in enumerate(RUN_OUTPUTS)}


@pytest.fixture
def model(monkeypatch) -> PageModel:
    """A fresh tiny shared model, the page's."""
    runner = tiny_runner()
    shared = local_model(WorkerModel(runner.loaded, runner, ReferenceCache(runner)))
    monkeypatch.setattr(shared_model, "_shared_model", shared)
    return shared


@pytest.fixture(scope="module")
def recorded():
    """The run the page opens on: the shipped recording."""
    return recording.load_recording()


REPLAY = RUN_INPUTS.index("replay_recent")  # Run's inputs before it, by position


def _link(**params) -> SimpleNamespace:
    """The request of a page opened at ``?key=value&...``."""
    return SimpleNamespace(query_params={k: str(v) for k, v in params.items()})


def _opened(request, preset: str | None, settings: RunSettings, previous, handle=None) -> tuple:
    """``link_opened`` with the page's Run inputs as ``settings`` and ``previous`` left them."""
    states = {"previous": previous, "handle": handle or RunHandle()}
    values = [states[n] if n in states else getattr(settings, n) for n in RUN_INPUTS]
    return opening.link_opened(request, preset, *values)


def _settings(rows=ROWS, num_slots=2) -> RunSettings:
    """What the page's Run reads after a link that set up ``rows`` at ``num_slots``."""
    return dataclasses.replace(
        recording.recorded_settings(), rows=rows, num_slots=num_slots, check_reference=False
    )


def _changed(update: tuple) -> list[str]:
    return [name for name in RUN_OUTPUTS if update[OUT[name]] != gr.skip()]


def test_a_link_to_a_setup_run_here_recently_shows_that_run_labelled(model, recorded):
    """A link whose setup ran on this host within the replay window shows that run, labelled
    "Shown at once: measured at ... identical setup", with "Run live anyway"."""
    settings = _settings()
    values = [getattr(settings, n, None) for n in RUN_INPUTS]
    *_, done = playground.run_event(*values[:REPLAY], replay_recent=False)
    shown = _opened(_link(preset="one-long-many-short"), LINKED, settings, recorded)
    assert shown[OUT["run_state"]] is done[OUT["run_state"]], "not the run measured here"
    status = shown[OUT["status_markdown"]]
    assert status.startswith("**Shown at once:** measured at ") and "identical setup" in status
    assert shown[OUT["live_button"]].visible is True, "no way to run it live"


def test_a_links_step_holds_on_a_run_shown_at_once(model, recorded):
    """``?...&step=1`` on a setup run here recently shows that run at step 1: the slider and the
    step views, where they showed its default step and Copy link then wrote that one (issue 51,
    item 8); a step past the run is clamped to its last."""
    settings = _settings()
    values = [getattr(settings, n, None) for n in RUN_INPUTS]
    *_, done = playground.run_event(*values[:REPLAY], replay_recent=False)
    state = done[OUT["run_state"]]
    assert run_view.default_step(state.continuous) != 1, "pick a step that is not the default"
    shown = _opened(_link(preset="one-long-many-short", step=1), LINKED, settings, recorded)
    assert shown[OUT["step_slider"]].value == 1, f"slider at {shown[OUT['step_slider']].value}"
    title = shown[OUT["packed_mask_plot"]].layout.title.text
    assert re.search(r"\bstep 1\b", title), f"the packed mask is not at step 1: {title!r}"
    far = _opened(_link(preset="one-long-many-short", step=999), LINKED, settings, recorded)
    assert far[OUT["step_slider"]].value == state.num_steps - 1, "a step past the end not clamped"


def test_a_links_step_holds_on_the_recorded_run_of_its_own_setup(model, recorded):
    """``?preset=seed&slots=3&step=3``, the recorded run's own setup, shows the recorded run at
    step 3: the slider and the step views, where they stayed at its default step and Copy link
    then wrote none (issue 51, item 8); so does ``?step=3`` alone. The run and its label stay as
    they opened."""
    own = recording.recorded_settings()
    assert run_view.default_step(recorded.continuous) != 3, "pick a step that is not the default"
    link = _link(preset="seed", slots=3, step=3)
    shown = _opened(link, recorded.recorded.preset, own, recorded)
    assert shown[OUT["step_slider"]].value == 3, f"slider at {shown[OUT['step_slider']]}"
    title = shown[OUT["packed_mask_plot"]].layout.title.text
    assert re.search(r"\bstep 3\b", title), f"the packed mask is not at step 3: {title!r}"
    views = {f"{name}_plot" for name in run_view.StepViews.__dataclass_fields__}
    assert set(_changed(shown)) == {"step_slider", *views}, _changed(shown)
    bare = _opened(_link(step=3), None, own, recorded)  # ?step=3 alone: the same setup
    assert bare[OUT["step_slider"]].value == 3, (
        f"?step=3 alone: slider at {bare[OUT['step_slider']]}"
    )


def test_a_link_to_another_setup_says_the_recorded_run_is_not_its_own(model, recorded):
    """With no recent run of the linked setup, the recorded run stays, and the status line over it
    says it is the recorded run of the article's six requests, not of the linked preset, and that
    Run measures the linked one; nothing else changes."""
    update = _opened(_link(preset="one-long-many-short", slots=2), LINKED, _settings(), recorded)
    assert _changed(update) == ["status_markdown"], _changed(update)
    status = update[OUT["status_markdown"]]
    head = (
        f"**Not the linked setup:** the results below are the recorded run of "
        f"“{recorded.recorded.preset}” at 3 slots"
    )
    assert status.startswith(head), status
    assert f"not of “{LINKED}” at 2 slots. Press Run to measure “{LINKED}” at 2 slots here." in (
        status
    ), status
    assert "press Run to measure it here" not in status, "the recording's own label contradicts"
    assert "continuous" in status and "steps against static" in status, "the run's line is gone"
    # the page's model picker names the embedded model, the one the recorded run ran on
    named = dataclasses.replace(_settings(), model=recording.MODEL)
    status = _opened(_link(preset="one-long-many-short", slots=2), LINKED, named, recorded)[
        OUT["status_markdown"]
    ]
    assert f"Press Run to measure “{LINKED}” at 2 slots here." in status, status


def test_no_link_or_a_link_to_the_recorded_setup_leaves_the_page_as_it_opened(model, recorded):
    """A page opened without a link, or with one that sets up the recorded run's own setup (the
    article's six requests at 3 slots), keeps the recorded run and its label; so does a page whose
    Run was pressed before the link's view was ready (what Run shows is never overwritten)."""
    other = _opened(_link(), LINKED, _settings(), recorded)
    assert _changed(other) == [], f"a page without a link changed {_changed(other)}"
    pressed = RunHandle()
    pressed.press()
    link = _link(preset="one-long-many-short", slots=2)
    after_run = _opened(link, LINKED, _settings(), recorded, pressed)
    assert _changed(after_run) == [], f"the link's view overwrote a Run: {_changed(after_run)}"
    own = recording.recorded_settings()
    assert opening._setup_key(model, own) is not None, "the recorded setup cannot be keyed here"
    same = _opened(_link(preset="seed", slots=3), recorded.recorded.preset, own, recorded)
    assert _changed(same) == [], f"a link to the recorded setup changed {_changed(same)}"


def test_app_runs_it_once_a_link_is_applied():
    """app.py chains ``link_opened`` to the event that applies a link: it reads the preset and
    what Run reads, writes what Run writes, and shows no progress over the page."""
    import app
    from engine.page.inputs import page_io

    demo = app.build_demo("Model: test")
    (opened,) = [fn for fn in demo.fns.values() if fn.fn is opening.link_opened]
    (link,) = [i for i, fn in demo.fns.items() if fn.fn is page_io.from_link]
    run = next(fn for fn in demo.fns.values() if fn.api_name == "run")
    assert opened.trigger_after == link, "not run after the link is applied"
    assert [c._id for c in opened.inputs[1:]] == [c._id for c in run.inputs]
    assert opened.inputs[0].elem_id == "preset_dropdown"
    assert [c._id for c in opened.outputs] == [c._id for c in run.outputs]
    assert opened.show_progress == "hidden", "page load covers the results with spinners"


def test_a_link_that_sets_up_the_recorded_run_on_a_page_with_servers_says_nothing_contrary(
    model, recorded
):
    """On a page whose host configured a server (ticked by its visitor), a link whose
    settings all fall back to the recorded run's keeps the recorded run as it opened, never "Not
    the linked setup ... not of" the same preset at the same slots; a link that differs in an
    engine setting names that setting."""
    from engine.host_servers import server_choice
    from engine.host_servers.server_choice import ServerChoice

    model.servers = server_choice.build(
        model.loaded, ServerChoice(endpoint=("gpu=http://127.0.0.1:9",))
    )
    own = dataclasses.replace(recording.recorded_settings(), server_names=["gpu"])
    link = _link(preset="nope", slots=99)  # both refused by the page: the defaults stand
    same = _opened(link, recorded.recorded.preset, own, recorded)
    assert _changed(same) == [], (
        f"the recorded setup said not to be the link's: {same[OUT['status_markdown']]}"
    )
    budget = dataclasses.replace(own, token_budget=64)
    status = _opened(link, recorded.recorded.preset, budget, recorded)[OUT["status_markdown"]]
    assert "at 3 slots with token budget 64." in status, (
        f"the differing setting is not named: {status}"
    )
