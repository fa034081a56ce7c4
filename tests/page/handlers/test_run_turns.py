"""Runs take turns through the page's queue, and an identical recent run is shown at once.

Two sessions' Run handlers run in threads, as Gradio runs them now that Run has no concurrency
limit of its own: the second waits in the page's queue and says its true place, then runs. A Run
whose setup equals one that finished here within the window is the earlier run, labelled, with
the "Run live anyway" button; Stop while waiting takes a run out of the queue.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import gradio as gr
import pytest
from tiny_model import make_requests, tiny_runner

from engine.config import EngineConfig
from engine.fidelity.reference import ReferenceCache
from engine.host_queue import run_cost
from engine.page.handlers import playground
from engine.page.run import shared_model
from engine.page.run.recent_runs import RecentRuns
from engine.page.run.run import Run, RunRequest
from engine.page.run.run_handle import RunHandle
from engine.page.run.run_options import RunOptions
from engine.page.run.shared_model import PageModel, local_model
from engine.page.views.run_view import RUN_OUTPUTS
from engine.worker.worker_model import WorkerModel

ROWS = [["hello world", 6], ["abc", 9]]
SLOW_STEP_S = 0.02
OUT = {name: i for i, name in enumerate(RUN_OUTPUTS)}


@pytest.fixture
def page(monkeypatch) -> PageModel:
    """A fresh tiny shared model whose continuous steps take SLOW_STEP_S, polled quickly."""
    runner = tiny_runner()
    model = local_model(WorkerModel(runner.loaded, runner, ReferenceCache(runner)))
    forward = runner.forward_packed

    def slow_forward(batch):
        time.sleep(SLOW_STEP_S)
        return forward(batch)

    monkeypatch.setattr(runner, "forward_packed", slow_forward)
    monkeypatch.setattr(shared_model, "_shared_model", model)
    monkeypatch.setattr(playground, "QUEUE_POLL_S", 0.05)
    monkeypatch.setattr(playground, "PROGRESS_INTERVAL_S", 0.05)
    return model


def _events(handle: RunHandle, replay: bool = True, rows=ROWS, previous=None):
    """A Run handler's updates (a generator), as the page's Run button starts it."""
    knobs = (2, False, True, "slots", 0, "decode_first", False, 0, "time")
    return playground.run_event(
        rows, *knobs, handle=handle, replay_recent=replay, previous=previous
    )


def _status(update: tuple) -> str:
    return update[OUT["status_markdown"]]


def test_a_second_session_waits_its_turn_with_its_true_place(page):
    """While one session's run holds the model, another's says "place 2 of 2" and an estimate
    only once a run has finished here; it then runs and finishes."""
    first_updates, second_updates = [], []
    first = threading.Thread(target=lambda: first_updates.extend(_events(RunHandle(), False)))
    first.start()
    deadline = time.monotonic() + 30
    while page.queue.size() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    second_updates.extend(_events(RunHandle(), replay=False))
    first.join(timeout=60)
    waiting = [_status(u) for u in second_updates if "Waiting for the model" in str(_status(u))]
    assert waiting, "the second run never said it was waiting"
    assert "place 2 of 2 (yours is next, after the run in progress)" in waiting[0], waiting[0]
    assert "no estimate yet" in waiting[0], waiting[0]
    for updates in (first_updates, second_updates):
        assert "✓ all match" in _status(updates[-1]), _status(updates[-1])
        assert updates[-1][OUT["run_note_markdown"]].startswith("✓ **Finished:**")
    assert page.queue.size() == 0 and page.queue.pace.known, "the queue learned no pace"


def test_an_identical_recent_run_is_shown_at_once_and_labelled(page, monkeypatch):
    """A Run with the same setup as a run that just finished shows that run, without touching
    the model, labelled as measured earlier; "Run live anyway" (no replay) runs the model."""
    (*_, done) = _events(RunHandle())
    state = done[OUT["run_state"]]

    def forbidden(*args, **kwargs):
        raise AssertionError("a replay called the model")

    with monkeypatch.context() as patched:
        patched.setattr(page.worker.model.runner, "forward_packed", forbidden)
        patched.setattr(page.worker.model.runner, "generate", forbidden)
        (replayed,) = list(_events(RunHandle()))
        (again,) = list(_events(RunHandle()))
    assert replayed[OUT["run_state"]] is state, "the replay is not the earlier run"
    status = _status(replayed)
    assert status.startswith("**Shown at once:** measured at ") and "identical setup" in status
    assert "s ago" in status and "✓ all match" in status, status
    plot = OUT["continuous_timeline_plot"]  # drawn once, shown to both
    assert again[plot] is replayed[plot] and replayed[plot] is not None
    assert _status(again).startswith("**Shown at once:** measured at "), _status(again)
    assert replayed[OUT["live_button"]].visible is True, "no way to run it live"
    *_, live = _events(RunHandle(), replay=False)
    assert live[OUT["run_state"]] is not state, "Run live anyway replayed"
    assert live[OUT["live_button"]].visible is False


def test_another_setup_or_an_old_run_is_not_replayed(page):
    """A different table runs live; a run older than the window is not shown."""
    *_, done = _events(RunHandle())
    *_, other = _events(RunHandle(), rows=[["hello world", 6], ["abc", 8]])
    assert other[OUT["run_state"]] is not done[OUT["run_state"]]
    page.recent = RecentRuns(window_s=60, clock=lambda: time.time() + 3600)
    page.recent.keep("anything", done[OUT["run_state"]])
    *_, again = _events(RunHandle())
    assert not _status(again).startswith("**Shown at once"), "a run past the window was shown"


def test_stop_while_waiting_takes_the_run_out_of_the_queue(page):
    """Stop pressed while a run waits: it leaves the queue at once and says so; the run holding
    the model is untouched."""
    holder = page.queue.join("someone else", 10)
    assert page.queue.wait_turn(holder, timeout_s=0)
    handle = RunHandle()
    handle.press()
    events = _events(handle, replay=False)
    waiting = next(u for u in events if "Waiting for the model" in str(_status(u)))
    assert "place 2 of 2" in _status(waiting) and page.queue.size() == 2
    assert handle.stop() == "waiting", "a run in the page's queue needs no Gradio cancel"
    assert page.queue.size() == 1, "Stop left the run in the queue"
    rest = list(events)
    assert rest and _status(rest[-1]) == playground.STOPPED_IN_QUEUE, [_status(u) for u in rest]
    page.queue.leave(holder)


def test_a_session_with_a_run_in_the_queue_cannot_queue_another(page):
    """A second run from a session whose run waits is refused with a message; nothing is lost."""
    holder = page.queue.join("someone else", 10)
    assert page.queue.wait_turn(holder, timeout_s=0)
    handle = RunHandle()
    waiting = _events(handle, replay=False)
    next(u for u in waiting if "Waiting for the model" in str(_status(u)))
    with pytest.warns(UserWarning, match="already in the queue"):
        (refused,) = list(_events(handle, replay=False))
    assert "**Not run:** Your run is already in the queue" in _status(refused)
    assert refused[OUT["run_state"]] == gr.skip()
    waiting.close()
    assert page.queue.size() == 1, "a closed handler left its ticket in the queue"
    page.queue.leave(holder)


def test_pressing_run_changes_the_note_under_it_at_once():
    """The unqueued press handler writes the note under Run and the status line and hides "Run
    live anyway"; a repeat press during a run changes none of them."""
    handle = RunHandle()
    note, live, status = playground.run_pressed(handle)
    assert note.startswith("**Run pressed:**"), note
    assert status.startswith("**Run pressed:**"), status
    assert live.visible is False, "the press left Run live anyway shown"
    repeat = playground.run_pressed(handle)
    assert repeat == (gr.skip(),) * 3, f"a repeat press changed the page: {repeat}"


def _live_shown(update: tuple) -> bool | None:
    """Whether an update shows "Run live anyway" (None: it leaves the button as it is)."""
    button = update[OUT["live_button"]]
    return None if button == gr.skip() else button.visible


def test_run_live_anyway_goes_once_pressed_and_comes_back_with_the_next_replay(page):
    """ "Run live anyway", shown with a run shown at once, goes when pressed: the press hides it,
    and so does every update of the live run while it waits in the queue and runs; the next run
    shown at once shows it again."""
    *_, done = _events(RunHandle())
    (replayed,) = list(_events(RunHandle()))
    assert _live_shown(replayed) is True, "no way to run it live"
    holder = page.queue.join("someone else", 10)  # the live run has to wait its turn
    assert page.queue.wait_turn(holder, timeout_s=0)
    handle = RunHandle()
    assert playground.run_pressed(handle)[1].visible is False, "the press left the button"
    live = _events(handle, replay=False, previous=done[OUT["run_state"]])
    waiting = next(live)
    assert "Waiting for the model" in _status(waiting), _status(waiting)
    assert _live_shown(waiting) is False, "the waiting live run left Run live anyway shown"
    page.queue.leave(holder)
    rest = list(live)
    shown = [_live_shown(u) for u in rest]
    assert True not in shown and shown[-1] is False, f"Run live anyway while it ran: {shown}"
    (again,) = list(_events(RunHandle()))
    assert _status(again).startswith("**Shown at once:**") and _live_shown(again) is True


def test_stop_while_waiting_shows_at_once_and_redraws_nothing(page, monkeypatch):
    """Stop on a run waiting in the queue ends its wait at once (not at its next poll), and what
    the page is sent redraws nothing: the status line says it stopped, then the previous run's
    status; the previous run's figures, tables and files stay as they are (a redraw at the
    server's low priority, on a CPU busy with the run in progress, held "Stopped" back for
    seconds)."""
    poll_s = 2.0
    monkeypatch.setattr(playground, "QUEUE_POLL_S", poll_s)
    *_, done = _events(RunHandle(), replay=False)
    previous = done[OUT["run_state"]]
    holder = page.queue.join("someone else", 10)
    assert page.queue.wait_turn(holder, timeout_s=0)
    handle = RunHandle()
    handle.press()
    events = _events(handle, replay=False, previous=previous)
    assert "Waiting for the model" in _status(next(events))
    pressed_s = []

    def press_stop():
        pressed_s.append(time.monotonic())
        handle.stop()

    stop = threading.Timer(0.2, press_stop)
    stop.start()
    (stopped,) = list(events)
    shown_s = time.monotonic() - pressed_s[0]
    stop.join()
    page.queue.leave(holder)
    assert shown_s < poll_s / 2, f"Stop showed {shown_s:.1f} s after it was pressed"
    status = _status(stopped)
    assert status.startswith(playground.STOPPED_IN_QUEUE), status
    assert "Showing the previous run:" in status and "✓ all match" in status, status
    assert stopped[OUT["run_note_markdown"]] == playground.STOPPED_IN_QUEUE
    changed = ("status_markdown", "run_note_markdown", "live_button")
    redrawn = [n for n in RUN_OUTPUTS if n not in changed and stopped[OUT[n]] != gr.skip()]
    assert not redrawn, f"a run stopped in the queue sent {redrawn} again"


def test_runs_waiting_for_an_identical_setup_are_shown_its_run_when_it_ends(page):
    """Three sessions press Run on the same setup at once: one measures it, the two waiting are
    shown that run as soon as it ends, without a turn on the model of their own."""
    updates = {i: [] for i in range(3)}

    def press(i):
        updates[i].extend(_events(RunHandle()))

    threads = [threading.Thread(target=press, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
        time.sleep(0.05)  # in order: the first joins first
    for thread in threads:
        thread.join(timeout=120)
    finals = [updates[i][-1] for i in range(3)]
    shown = [_status(f).startswith("**Shown at once:**") for f in finals]
    assert shown == [False, True, True], [_status(f)[:60] for f in finals]
    assert all(f[OUT["run_state"]] is finals[0][OUT["run_state"]] for f in finals[1:])
    assert page.queue.size() == 0


def test_a_waiting_run_sends_its_line_only_when_its_words_change(page, monkeypatch):
    """While nothing ahead moves, a waiting run polls its place every 0.1 s but sends its line
    only when its words change (the wait, to 10 s) or ``QUEUE_RESEND_S`` has passed: each send
    costs the server CPU time that the run being measured would have."""
    now = [0.0]
    monkeypatch.setattr(page.queue, "clock", lambda: now[0])
    running = page.queue.join("first", 100)
    assert page.queue.wait_turn(running, timeout_s=0.0)
    monkeypatch.setattr(playground, "QUEUE_POLL_S", 0.001)
    polls = []

    def find_recent(_key):
        polls.append(now[0])
        now[0] += 0.1
        return None

    monkeypatch.setattr(page.recent, "find", find_recent)
    request = RunRequest(page, make_requests([("hello", 100)]), EngineConfig(1), RunOptions())
    handle = RunHandle()
    run = Run(request, handle, handle.start())
    updates = playground._follow(run, "time")
    sends = []  # (clock, line)
    while now[0] < 60.0:
        sends.append((now[0], next(updates)[OUT["status_markdown"]]))
    updates.close()
    run.close()
    assert len(polls) >= 600, len(polls)
    expected = "place 2 of 2 (yours is next, after the run in progress) · waited 0 s"
    assert expected in sends[0][1], sends[0][1]
    # its words change every 10 s (the wait, rounded), or it is sent again after QUEUE_RESEND_S
    most = 2 + 60 / min(10.0, playground.QUEUE_RESEND_S)
    assert len(sends) <= most, f"{len(sends)} sends in 60 s"
    for (before_s, before), (after_s, after) in zip(sends, sends[1:], strict=False):
        gap_s = after_s - before_s
        assert after != before or gap_s >= playground.QUEUE_RESEND_S - 0.2, (gap_s, after)
    assert any("waited 60 s" in line for _, line in sends), "the wait was not kept up to date"


def test_the_queue_line_rounds_its_waits():
    """A waiting run's line says its wait and estimate to 10 s under 90 s, else in minutes, so
    that it does not change (and is not sent again) every second."""
    from engine.host_queue.run_queue import Place
    from engine.page.views.progress_view import queue_line

    line = queue_line(Place(5, 5, 7.0, 627.0, after_running=True), measured=True)
    assert "place 5 of 5 (4 before yours) · waited 10 s · estimate 10 min" in line, line
    line = queue_line(Place(1, 3, 1.0, 5.0), measured=True)  # between two runs
    assert "place 1 of 3 (yours is next) · " in line, line
    line = queue_line(Place(2, 3, 44.0, 86.0), measured=True)
    assert "waited 40 s · estimate 90 s" in line, line
    line = queue_line(Place(2, 2, 44.0, 4.4, after_running=True), measured=True)
    assert "estimate a few seconds." in line, line  # not "0 s": the run in progress ends soon
    line = queue_line(Place(3, 5, 3.0, 25.0, after_running=True, identical_ahead=True), True)
    assert line.endswith(
        "estimate 20 s. An identical run is ahead of yours: you are shown it when it ends."
    ), line


def test_the_queue_line_gives_an_identical_runs_place_as_that_runs():
    """A run waiting for an identical run ahead is told that run's place (its own adds none), and
    whether that run is in progress, next, or has runs before it; never "yours is next"."""
    from engine.host_queue.run_queue import Place
    from engine.page.views.progress_view import queue_line

    running = queue_line(Place(1, 3, 3.0, 25.0, after_running=True, identical_ahead=True), True)
    assert "place 1 of 3 (an identical run's, in progress) · " in running, running
    waiting = queue_line(Place(3, 5, 3.0, 25.0, after_running=True, identical_ahead=True), True)
    assert "place 3 of 5 (an identical run's, 2 before it) · " in waiting, waiting
    between = queue_line(Place(1, 2, 3.0, 25.0, identical_ahead=True), True)  # between two runs
    assert "place 1 of 2 (an identical run's, next) · " in between, between
    assert not any("yours is next" in line for line in (running, waiting, between))


def test_a_run_over_the_limit_is_not_run_and_keeps_the_results(page, monkeypatch):
    """Through the Run event (the Run button's and /run's path), a run whose estimate at the pace
    learned here is well over the host's run limit is refused before it queues: "Not run" with
    its estimate and the limit, the previous run's results left as they are."""
    from engine.host_queue.run_cost import Pace

    *_, done = _events(RunHandle(), replay=False)
    previous = done[OUT["run_state"]]
    page.queue.pace = Pace.uniform(100.0)  # as if finished runs taught 100 s a step
    monkeypatch.setenv("CBP_RUN_TIME_LIMIT_S", "60")
    with pytest.warns(UserWarning, match="estimate here"):
        (refused,) = list(_events(RunHandle(), replay=False, previous=previous))
    status = _status(refused)
    assert status.startswith("**Not run:** This run's estimate here is "), status
    assert "limit of 60 s" in status and "fewer rows" in status, status
    assert "Showing the previous run:" in status and "✓ all match" in status, status
    assert refused[OUT["run_state"]] == gr.skip(), "the previous results were replaced"
    assert page.queue.size() == 0, "a refused run was queued"


def test_the_room_reads_every_estimate_the_page_tells():
    """The room bench parses the queue line's estimate as the page writes it, "a few seconds"
    as 0 (``estimate_error`` allows the rounding)."""
    from engine.host_queue.run_queue import Place
    from engine.page.views.progress_view import queue_line
    from tools.room.session import Session, read_status

    for estimate_s, told_s in [(4.4, 0.0), (44.0, 40.0), (627.0, 600.0)]:
        session = Session(0, "seed", custom=False)
        read_status(session, queue_line(Place(2, 2, 1.0, estimate_s), measured=True), 1.0)
        assert session.first_estimate_s == told_s, (estimate_s, session.first_estimate_s)


def test_continuous_steps_pack_the_caps_onto_the_slots():
    """Caps 12, 20, 8, 30 on two slots take 50 continuous steps (the 30 starts when both early
    slots are free at step 20), not ``max(sum / slots, longest)`` = 35; a token budget adds the
    prefill chunks of a long prompt."""
    from engine.config import EngineConfig
    from engine.sequence import Request

    caps = (12, 20, 8, 30)
    requests = [Request(i, "p", cap, tuple(range(40))) for i, cap in enumerate(caps)]
    assert run_cost.continuous_steps(requests, EngineConfig(num_slots=2)) == 50
    assert run_cost.continuous_steps(requests, EngineConfig(num_slots=4)) == 30
    budget = EngineConfig(num_slots=2, max_num_batched_tokens=16)  # 40 tokens: 2 chunks more
    assert run_cost.continuous_steps(requests, budget) == 54, "slots free at 14, 22, 24, 54"


def test_the_static_prefill_estimate_is_what_the_static_engine_computes():
    """Prompts of 3, 10 | 5, 2 tokens on 2 slots: each wave's rows padded to its longest prompt,
    20 + 10 prompt positions, in the estimate and in the static engine's own trace."""
    from engine.batching.static import StaticEngine
    from engine.config import EngineConfig
    from engine.sequence import Request

    lengths = (3, 10, 5, 2)
    requests = [Request(i, "p", 3, tuple(range(1, n + 1))) for i, n in enumerate(lengths)]
    config = EngineConfig(num_slots=2)
    assert run_cost.static_prefill_tokens(requests, config) == 30
    assert StaticEngine(tiny_runner(), config).run(requests).prefill_split()[0] == 30


def test_a_dtype_named_or_left_blank_is_the_same_setup(page):
    """A Run that names the loaded model's dtype (the page's dropdown) and one that leaves it blank
    (an API client) are the same setup, so one is shown the other's run; another knob is not."""
    from engine.page.run.run_options import RunOptions, prepare

    options = RunOptions(check_reference=False)
    requests, config = prepare(page, ROWS, 2, options)
    named = dataclasses.replace(options, dtype=page.dtype_name)
    key = RunRequest(page, requests, config, options).setup_key()
    assert RunRequest(page, requests, config, named).setup_key() == key
    other = dataclasses.replace(options, block_size=8)
    assert RunRequest(page, requests, config, other).setup_key() != key
