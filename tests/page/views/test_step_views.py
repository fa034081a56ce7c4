"""The step views: a step typed into the slider's box outside the run is clamped, as a plain
function and through the served page's ``/step`` API, with no error."""

from __future__ import annotations

import pytest

from engine.page.handlers import recording
from engine.page.views.run_view import step_views
from engine.peers.server_process import free_port

try:
    from gradio_client import Client
except ImportError:  # gradio_client ships with gradio, but keep the module importable without it
    Client = None


@pytest.fixture(scope="module")
def state():
    """The shipped recording's run (the page opens on it)."""
    shown = recording.opening_result()
    if shown is None:
        pytest.skip("no recording ships")
    return shown.state


def _json(views) -> list:
    return [None if fig is None else fig.to_json() for fig in views.as_tuple()]


@pytest.mark.parametrize(("typed", "step"), [(999999, -1), (-5, 0), (3.0, 3)])
def test_out_of_range_steps_show_the_first_or_last_step(state, typed, step):
    """step_views at a step past either end draws exactly the views of that end (no past-the-end
    note, no error)."""
    step = step % state.num_steps
    got, wanted = _json(step_views(state, typed, "time")), _json(step_views(state, step, "time"))
    assert got == wanted, f"step {typed} is not drawn as step {step}"


@pytest.mark.skipif(Client is None, reason="the gradio_client package is not installed")
def test_served_step_api_takes_out_of_range_steps(state):
    """Through a served page, /step with 999999 or -5 returns the views of the last or first step
    instead of gr.Slider's "greater than maximum value" error."""
    import app

    demo = app.build_demo("Model: test")
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True)
    try:
        client = Client(demo.local_url, verbose=False)
        last = state.num_steps - 1
        first, final = (client.predict(step, "time", api_name="/step") for step in (0, last))
        assert first != final, "the first and last step show the same views: nothing is checked"
        for typed, views in ((999999, final), (-5, first)):
            assert client.predict(typed, "time", api_name="/step") == views, f"step {typed}"
    finally:
        demo.close()
