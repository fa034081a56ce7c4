"""Run and Stop through a session's RunHandle: Run after Stop starts, a repeat press is skipped,
Stop before a run starts or with nothing running says what it did."""

from __future__ import annotations

import gradio as gr
import pytest

from engine.page.handlers import playground
from engine.page.run import shared_model
from engine.page.run.run_handle import IDLE, QUEUED, RUNNING, RunHandle
from engine.page.views import run_view
from engine.serving.run_control import RunCancelled, RunControl

KNOBS = (2, False, False, "slots", 0, "decode_first", False, 0, "time")
STATUS = run_view.RUN_OUTPUTS.index("status_markdown")


@pytest.fixture(autouse=True)
def tiny_shared(shared, monkeypatch):
    monkeypatch.setattr(shared_model, "_shared_model", shared)


def test_stop_with_nothing_running_says_so_and_changes_nothing():
    """Stop on an idle page answers "idle" (a toast says nothing runs), not "Stopped"."""
    assert playground.stop_event(RunHandle()) == IDLE
    assert playground.stop_event(None) == IDLE


def test_stop_of_a_running_run_sets_its_own_stop_flag():
    """Stop reaches the running run's RunControl, which then raises at its next check."""
    handle, control = RunHandle(), RunControl()
    handle.press()
    assert handle.start() is None
    handle.attach(control)
    assert handle.stop() == RUNNING
    with pytest.raises(RunCancelled):
        control.check()


def test_run_pressed_while_the_stopped_run_ends_starts():
    """A press after Stop, while the stopped run still ends, is a real press: it starts next."""
    handle = RunHandle()
    handle.press()
    handle.start()
    handle.attach(RunControl())
    handle.stop()
    handle.press()  # 0.2 s after Stop: the browser defers it until the stopped run ends
    handle.finish()
    assert handle.start() is None, "the run pressed after Stop did not start"


def test_a_second_press_during_a_run_is_skipped(shared):
    """Run pressed again while a run goes on (no Stop): its deferred run changes nothing."""
    handle = RunHandle()
    handle.press()
    handle.start()
    handle.press()
    handle.finish()
    updates = list(playground.run_event([["hi", 2]], *KNOBS, handle=handle))
    assert updates == [run_view.run_outputs()], "the repeat press ran or changed the page"
    assert handle.start() is None, "the press after the skipped repeat does not start"


def test_stop_while_queued_ends_the_run_before_it_starts(shared, monkeypatch):
    """Stop before the run left the queue: Stop answers "queued"; when the run's turn comes it
    ends at once, saying so, without calling the model."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the model ran for a run stopped in the queue")

    monkeypatch.setattr(shared.runner, "forward_packed", forbidden)
    monkeypatch.setattr(shared.runner, "generate", forbidden)
    handle = RunHandle()
    handle.press()
    assert playground.stop_event(handle) == QUEUED
    (update,) = playground.run_event([["hi", 2]], *KNOBS, handle=handle)
    assert update[STATUS].startswith(playground.STOPPED_IN_QUEUE), update[STATUS]
    assert not handle.pressed and not handle.stop_requested, "the handle kept the stopped run"


def test_leaving_the_queue_resets_the_handle():
    """Once the queued run is taken out of the queue, the next press starts normally."""
    handle = RunHandle()
    handle.press()
    handle.stop()
    shown = playground.left_queue_event(handle, None, "time")
    assert shown[STATUS].startswith(playground.STOPPED_IN_QUEUE), shown[STATUS]
    handle.press()
    assert handle.start() is None


def test_each_session_gets_its_own_handle():
    """gr.State deep-copies its first value per session: every copy is a fresh handle."""
    import copy

    first = RunHandle()
    first.press()
    fresh = copy.deepcopy(first)
    assert not fresh.pressed and fresh is not first
    state = gr.State(RunHandle())
    assert isinstance(state.value, RunHandle) and not state.value.pressed
