"""Quick Run/Stop pairs, as a person presses them, leave the page in a true state.

The Run and Stop handlers run as Gradio 6 runs them for app.py's wiring (``_Tab``): the unqueued
press, the Run event's generator consumed in a thread (deferred while the previous Run event
goes, ``trigger_mode="always_last"``), Stop in a thread, and where Stop answers "queued" the
hidden button's cancel and ``left_queue_event``. Steps take 0.1 s and putting the previous run
back 0.3 s, so a Stop lands while a stopped run still ends, as on the real page.
"""

from __future__ import annotations

import random
import threading
import time

import gradio as gr
import pytest
from tiny_model import tiny_runner

from engine.fidelity.reference import ReferenceCache
from engine.page.handlers import playground
from engine.page.run import shared_model
from engine.page.run.run_handle import RunHandle
from engine.page.run.shared_model import PageModel, local_model
from engine.page.views import progress_view
from engine.page.views.run_view import RUN_OUTPUTS
from engine.worker.worker_model import WorkerModel

ROWS = [["hello world", 6], ["abc", 9]]
STEP_S = 0.1  # a continuous step: a stopped run ends within one
REDRAW_S = 0.3  # putting the previous run back redraws every chart: this long on a busy host
STATUS = RUN_OUTPUTS.index("status_markdown")


@pytest.fixture
def page(monkeypatch) -> PageModel:
    """A fresh tiny shared model with slow steps and a slow redraw of the previous run."""
    runner = tiny_runner()
    model = local_model(WorkerModel(runner.loaded, runner, ReferenceCache(runner)))
    forward, previous_outputs = runner.forward_packed, progress_view.previous_outputs

    def slow_forward(batch):
        time.sleep(STEP_S)
        return forward(batch)

    def slow_previous_outputs(*args, **named):
        if len(args) > 2:  # the previous run redrawn
            time.sleep(REDRAW_S)
        return previous_outputs(*args, **named)

    monkeypatch.setattr(runner, "forward_packed", slow_forward)
    monkeypatch.setattr(progress_view, "previous_outputs", slow_previous_outputs)
    monkeypatch.setattr(shared_model, "_shared_model", model)
    monkeypatch.setattr(playground, "QUEUE_POLL_S", 0.05)
    monkeypatch.setattr(playground, "PROGRESS_INTERVAL_S", 0.05)
    return model


def _events(handle: RunHandle):
    """A live Run handler's updates (a generator), as the page's Run button starts it."""
    knobs = (2, False, True, "slots", 0, "decode_first", False, 0, "time")
    return playground.run_event(ROWS, *knobs, handle=handle, replay_recent=False)


def _status(update: tuple) -> str:
    return update[STATUS]


class _RunEvent:
    """One Run event in a browser tab: its handler's generator, consumed in a thread."""

    def __init__(self, updates, pressed_s: float):
        self.updates = updates
        self.pressed_s = pressed_s  # when the press it runs for was made
        self.lock = threading.Lock()  # held while the generator executes
        self.cancelled = False
        self.done = threading.Event()  # the browser sees the event end (finished or cancelled)
        self.closed = threading.Event()  # the generator ran to its end or was closed


class _Tab:
    """One browser tab's Run and Stop, as Gradio 6 runs them for app.py's wiring.

    Clicks on Run and Stop are numbered in one sequence, as the page's script does. Run calls
    ``run_pressed`` with its click's number, then sends the Run event; while the tab's previous
    Run event has not ended it defers the click instead (``trigger_mode="always_last"``: only the
    last click is kept) and replays it whole when that event ends: ``run_pressed`` again (with
    the latest Run click's number), then the event. A
    sent event waits up to ``dispatch_s`` for a worker (Gradio's queue), then its generator is
    consumed in a thread. Stop calls ``stop_event`` in a thread; an answer "queued" comes back to
    the browser (5-40 ms), whose script clicks the hidden button: the cancel of every Run event
    of the tab (the browser sees each end at once and replays nothing; Gradio closes the
    generator once it is not executing), and ``left_queue_event``. The status line shows the
    last status sent; ``shows`` keeps every status with its time and event, ``stops_s`` the times
    Stop was pressed.
    """

    def __init__(self, rng, gradio_queue: bool, dispatch_s: float):
        self.rng, self.dispatch_s = rng, dispatch_s
        self.handle = RunHandle(gradio_queue)
        self.lock = threading.Lock()
        self.shows: list[tuple[float, _RunEvent | None, str]] = []
        self.events: list[_RunEvent] = []
        self.deferred_s: float | None = None  # when the press the browser defers was made
        self.stops: list[threading.Thread] = []
        self.stops_s: list[float] = []
        self.num_clicks = 0  # clicks on Run and Stop so far (assets/page.js numbers them)
        self.run_click = 0  # the latest Run click's number

    def run(self) -> None:
        pressed_s = time.monotonic()
        self.num_clicks += 1
        self.run_click = self.num_clicks
        playground.run_pressed(self.handle, self.run_click)
        with self.lock:
            if self.events and not self.events[-1].done.is_set():
                self.deferred_s = pressed_s
            else:
                self._send(pressed_s)

    def stop(self) -> None:
        self.num_clicks += 1
        thread = threading.Thread(target=self._stop, args=(self.num_clicks,))
        self.stops.append(thread)
        thread.start()

    def settle(self, timeout_s: float = 60) -> None:
        """Wait until every event and Stop of this tab has ended."""
        deadline = time.monotonic() + timeout_s
        for thread in self.stops:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        pending = lambda: not all(e.done.is_set() for e in self.events)  # noqa: E731
        while (self.deferred_s is not None and pending()) or not all(
            e.closed.is_set() for e in self.events
        ):
            assert time.monotonic() < deadline, "the tab's events never settled"
            time.sleep(0.01)

    def status(self) -> str:
        with self.lock:
            return self.shows[-1][2] if self.shows else ""

    def lost_stops(self, grace_s: float) -> list[str]:
        """What runs pressed before a Stop showed over ``grace_s`` after it: progress or results."""
        return [
            status
            for stop_s in self.stops_s
            for shown_s, event, status in self.shows
            if event is not None and event.pressed_s < stop_s < shown_s - grace_s
            if status.startswith("**Running**") or "✓" in status
        ]

    def _show(self, update: tuple, event: _RunEvent | None = None) -> None:
        status = _status(update)
        if status != gr.skip():
            with self.lock:
                self.shows.append((time.monotonic(), event, status))

    def _send(self, pressed_s: float) -> None:  # with self.lock held
        event = _RunEvent(_events(self.handle), pressed_s)
        self.events.append(event)
        threading.Thread(target=self._consume, args=(event,)).start()

    def _consume(self, event: _RunEvent) -> None:
        time.sleep(self.rng.uniform(0, self.dispatch_s))  # Gradio's queue hands it to a worker
        try:
            while True:
                with event.lock:
                    if event.cancelled:
                        return
                    try:
                        update = next(event.updates)
                    except StopIteration:
                        break
                    if not event.cancelled:
                        self._show(update, event)
        finally:
            if not event.cancelled:
                event.closed.set()
                self._ended(event)

    def _ended(self, event: _RunEvent, replay: bool = True) -> None:
        """The browser sees ``event`` end; unless cancelled, it replays a deferred click whole:
        ``run_pressed`` again, then the Run event (Gradio's ``dispatch`` of the click again)."""
        with self.lock:
            if not event.done.is_set():
                event.done.set()
                if replay and self.deferred_s is not None:
                    playground.run_pressed(self.handle, self.run_click)
                    self._send(self.deferred_s)
                    self.deferred_s = None

    def _stop(self, seq: int) -> None:
        self.stops_s.append(time.monotonic())
        answer = playground.stop_event(self.handle, seq)
        if answer != "queued":
            return
        time.sleep(self.rng.uniform(0.005, 0.04))  # the answer's way to the browser and back
        cancelled = [e for e in self.events if not e.done.is_set()]  # cancels=[run, live]
        for event in cancelled:
            event.cancelled = True
            self._ended(event, replay=False)  # Gradio's cancel replays no deferred click
        self._show(playground.left_queue_event(self.handle, None, "time"))
        for event in cancelled:
            with event.lock:
                event.updates.close()
                event.closed.set()


@pytest.mark.parametrize(
    ("gradio_queue", "dispatch_s"), [(False, 0.02), (True, 0.2)], ids=["page_queue", "zerogpu"]
)
def test_quick_run_stop_pairs_leave_the_page_in_a_true_state(page, gradio_queue, dispatch_s):
    """Run and Stop pressed in quick succession many times (another tab's run holding the model
    now and then), then twice while the first stopped run still ends: no run pressed before a
    Stop goes on after it; the handle ends idle, the queue empty, the status line on Stopped;
    the next Run runs to the end."""
    rng = random.Random(27)
    tab = _Tab(rng, gradio_queue, dispatch_s)
    for i in range(12):
        other = page.queue.join("another tab", 10) if i % 4 == 1 else None
        if other is not None:
            page.queue.wait_turn(other, timeout_s=0)
        tab.run()
        time.sleep(rng.uniform(0.06, 0.14))  # quick clicks, while the stopped run still ends
        tab.stop()
        time.sleep(rng.uniform(0.06, 0.14))
        if other is not None:
            page.queue.leave(other)
    tab.settle()
    for _ in range(2):  # the last two pairs while the first stopped run still ends (0.4 s)
        tab.run()
        time.sleep(0.1)
        tab.stop()
        time.sleep(0.1)
    tab.settle()
    lost = tab.lost_stops(grace_s=1.5)  # a stopped run ends within a step (0.1 s)
    assert not lost, f"runs went on after a Stop: {lost}"
    assert tab.handle.idle and tab.handle.control is None, "the handle holds a run"
    assert page.queue.size() == 0, "a stopped run stayed in the queue"
    assert tab.status().startswith("**Stopped**"), f"after the last Stop: {tab.status()}"
    tab.run()
    tab.settle()
    assert "✓ all match" in tab.status(), tab.status()
