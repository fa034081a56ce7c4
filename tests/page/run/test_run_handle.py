"""Run and Stop through a session's RunHandle: Run after Stop starts, a repeat press is skipped,
Stop before a run starts or with nothing running says what it did."""

from __future__ import annotations

import gradio as gr
import pytest

from engine.page.handlers import playground
from engine.page.run import shared_model
from engine.page.run.run_handle import IDLE, QUEUED, RUNNING, WAITING, RunHandle
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
    turn = handle.start()
    assert turn.skip is None
    handle.attach(turn, control)
    assert handle.stop() == RUNNING
    with pytest.raises(RunCancelled):
        control.check()


def test_run_pressed_while_the_stopped_run_ends_starts():
    """A press after Stop, while the stopped run still ends, is a real press: it starts next."""
    handle = RunHandle()
    handle.press(1)  # the click's number in the page's sequence of Run and Stop clicks
    turn = handle.start()
    handle.attach(turn, RunControl())
    handle.stop(2)
    assert handle.press(3), "a press after Stop was taken for a repeat"
    handle.finish(turn)  # 0.2 s after Stop: the browser deferred the click until now
    assert handle.press(3), "the deferred click's replay says its run will not go"
    assert handle.start().skip is None, "the run pressed after Stop did not start"


def test_a_second_press_during_a_run_is_skipped(shared):
    """Run pressed again while a run goes on (no Stop): its deferred run changes nothing."""
    handle = RunHandle()
    handle.press(1)
    turn = handle.start()
    assert not handle.press(2), "a second press during a run was not taken for a repeat"
    handle.finish(turn)
    assert not handle.press(2), "the repeat's replayed click says a run will go"
    updates = list(playground.run_event([["hi", 2]], *KNOBS, handle=handle))
    assert updates == [run_view.run_outputs()], "the repeat press ran or changed the page"
    handle.press(3)
    assert handle.start().skip is None, "the press after the skipped repeat does not start"


def test_stop_while_queued_ends_the_run_before_it_starts(shared, monkeypatch):
    """Stop before the run's handler started: Stop answers "waiting" ("queued" where runs wait in
    Gradio's queue, which the page then cancels); when the handler starts it ends at once, saying
    so, without calling the model."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the model ran for a run stopped in the queue")

    monkeypatch.setattr(shared.worker.model.runner, "forward_packed", forbidden)
    monkeypatch.setattr(shared.worker.model.runner, "generate", forbidden)
    for gradio_queue, answer in ((False, WAITING), (True, QUEUED)):
        handle = RunHandle(gradio_queue)
        handle.press()
        assert playground.stop_event(handle) == answer, "Stop before the start answered wrongly"
        (update,) = playground.run_event([["hi", 2]], *KNOBS, handle=handle)
        assert update[STATUS].startswith(playground.STOPPED_IN_QUEUE), update[STATUS]
        assert handle.idle, "the handle kept the stopped run"


def test_leaving_the_queue_resets_the_handle():
    """Once the run is cancelled in Gradio's queue, the handle is idle and the next press starts
    normally."""
    handle = RunHandle(gradio_queue=True)
    handle.press()
    assert handle.stop() == QUEUED
    shown = playground.left_queue_event(handle, None, "time")
    assert shown[STATUS].startswith(playground.STOPPED_IN_QUEUE), shown[STATUS]
    assert handle.idle, "a cancelled press still waits to start"
    handle.press()
    assert handle.start().skip is None


def test_each_session_gets_its_own_handle():
    """gr.State deep-copies its first value per session: every copy is a fresh handle."""
    import copy

    first = RunHandle(gradio_queue=True)
    first.press()
    fresh = copy.deepcopy(first)
    assert fresh.idle and fresh is not first and fresh.gradio_queue
    state = gr.State(RunHandle())
    assert isinstance(state.value, RunHandle) and state.value.idle


def test_a_stopped_run_that_ends_late_leaves_the_next_run_alone():
    """A stopped run whose handler ends after the next run started (a generator closed late)
    neither frees nor hides the next run: Stop still reaches it."""
    handle = RunHandle()
    handle.press()
    first = handle.start()
    handle.attach(first, RunControl())
    assert handle.stop() == RUNNING
    handle.press()
    second, control = handle.start(), RunControl()
    handle.attach(second, control)
    handle.finish(first)
    assert not handle.idle, "the late end of the stopped run made the page idle"
    assert handle.stop() == RUNNING
    with pytest.raises(RunCancelled):
        control.check()


def test_presses_before_a_start_give_one_run_for_the_latest():
    """A double press gives one run; presses before a start run for the latest one: stopped if
    Stop came after it, else run once (the replayed click's run is skipped)."""
    handle = RunHandle()
    assert handle.press(1) and not handle.press(2), "a double press was taken for two runs"
    turn = handle.start()
    assert turn.skip is None
    handle.finish(turn)
    assert not handle.press(2), "the deferred second click's replay says a run will go"
    assert handle.start().skip == "repeat", "a double press ran twice"
    handle = RunHandle()
    handle.press(1)
    assert handle.stop(2) == WAITING and not handle.idle, "Stop overlooked a press not started"
    assert handle.press(3), "a press after Stop was taken for a repeat"
    turn = handle.start()
    assert turn.skip is None, "the press after Stop did not run"
    handle.finish(turn)
    handle.press(3)  # the deferred click's replay
    assert handle.start().skip == "repeat", "one press ran twice"
    handle.press(4)
    handle.stop(5)
    assert handle.start().skip == "stopped", "a press before Stop ran"


def test_a_replayed_click_is_not_a_new_press():
    """The browser replays a click it deferred (press, then run) when the pending run ends: the
    replay does not undo a Stop that came after the click; a session that never pressed (an
    API client) runs."""
    handle = RunHandle()
    handle.press(1)
    turn = handle.start()
    handle.attach(turn, RunControl())
    handle.stop(2)
    assert handle.press(3), "a press after Stop was taken for a repeat"
    assert handle.stop(4) == RUNNING
    handle.finish(turn)
    assert not handle.press(3), "the replay of a stopped click says its run will go"
    assert handle.start().skip == "stopped", "a replayed click undid the Stop after it"
    assert handle.idle, "a replayed click was counted as a new press"
    assert RunHandle().start().skip is None


def test_a_repeat_then_stop_then_run_runs_the_last_press():
    """Run twice during a run, Stop, Run: the browser replays the last click, and it runs."""
    handle = RunHandle()
    handle.press(1)
    turn = handle.start()
    handle.attach(turn, RunControl())
    assert not handle.press(2)
    handle.stop(3)
    assert handle.press(4)
    handle.finish(turn)
    assert handle.press(4), "the replayed click says its run will not go"
    assert handle.start().skip is None, "the press after Stop was skipped as a repeat"


def test_a_click_the_browser_did_not_defer_is_never_taken_for_a_replay():
    """Issue 27: clicks the browser sent rather than deferred (its view of the pending run lags
    the server's) leave no replay due: the next click, much later, runs."""
    handle = RunHandle()
    handle.press(1)
    turn = handle.start()
    handle.finish(turn)  # the run's end has not reached the browser: it defers the next click
    assert handle.press(2), "a press after the run ended was taken for a repeat"
    assert handle.press(2), "the replay of that deferred click says its run will not go"
    turn = handle.start()
    assert turn.skip is None, "the click after the run ended did not run"
    assert not handle.press(3), "a press during a run was not taken for a repeat"
    handle.finish(turn)  # the browser sent click 3's Run event at once (its run not yet seen)
    assert handle.start().skip == "repeat", "the repeat press ran"
    assert handle.press(4), "a new click, much later, was taken for a replay"
    assert handle.start().skip is None, "a new click, much later, did not run"


def test_stops_and_presses_reaching_the_server_out_of_order_act_in_click_order():
    """Issue 27: under load an unqueued Stop was handled before the press of a Run clicked 80 ms
    earlier. By their click numbers: the last Stop still stops that press, and an earlier Stop
    arriving late neither stops the run of a later press nor turns a real press into a repeat."""
    handle = RunHandle()
    handle.press(1)
    turn = handle.start()
    handle.attach(turn, RunControl())
    assert not handle.press(3), "a press during a run, its Stop not yet arrived, said it runs"
    assert handle.stop(2) == RUNNING, "the Stop before press 3, arriving after it, did not stop"
    assert handle.stop(5) == RUNNING
    assert not handle.press(4), "a press that Stop 5 came after says its run will go"
    handle.finish(turn)
    assert not handle.press(4), "the replay of press 4 says its run will go"
    assert handle.start().skip == "stopped", "press 4 ran although Stop 5 came after it"
    assert handle.idle, "the stopped presses still wait"
    handle.press(6)
    second, control = handle.start(), RunControl()
    assert second.skip is None, "the run pressed after the Stops did not start"
    handle.attach(second, control)
    assert handle.stop(2) == WAITING, "a late Stop older than the run answered as if it stopped"
    control.check()  # not stopped
    assert handle.stop(7) == RUNNING
    with pytest.raises(RunCancelled):
        control.check()


def test_a_closed_or_reloaded_session_stops_its_run_and_its_presses():
    """``demo.unload``'s handler, given the page's first handle, finds the session that pressed
    Run (by Gradio's session hash) and stops its running run, marked abandoned (never kept), and
    a press of it not yet started; another session's run goes on."""
    import copy

    first = RunHandle()
    gone, other = copy.deepcopy(first), copy.deepcopy(first)  # two sessions' handles
    for handle, name in ((gone, "gone"), (other, "other")):
        playground.run_pressed(handle, 1, gr.Request(session_hash=name))
    turn, control = gone.start(), RunControl()
    gone.attach(turn, control)
    other_turn, other_control = other.start(), RunControl()
    other.attach(other_turn, other_control)
    playground.run_pressed(gone, 2, gr.Request(session_hash="gone"))  # deferred: not started
    playground.session_end_event(first)(gr.Request(session_hash="gone"))
    with pytest.raises(RunCancelled):
        control.check()
    assert turn.abandoned, "the gone session's run may still be kept for replay"
    gone.finish(turn)
    assert gone.start().skip is not None, "a press of the gone session started a run"
    other_control.check()  # still running: no exception
    assert not other_turn.abandoned
