"""One visitor's run, as Run and Stop see it: pressed, waiting in a queue, running, stopping.

Stop does not cancel the Run event through Gradio (``cancels=``): a cancel waits for the handler's
current poll to return, and until it does the browser silently drops another Run press (Gradio's
``trigger_mode="once"``) and may lay an "Error" badge over the status line. Instead each session
keeps a ``RunHandle`` in a ``gr.State``; Stop (an event that waits for no other) sets the
stop flag of the run's own ``RunControl``, and the run ends itself within one engine step and
says so. Run's event uses ``trigger_mode="always_last"``: a press while the previous run is still
stopping is kept by the browser and starts the moment that run ends.

What the browser does with a click on Run (Gradio 6's ``dispatch``), which the handle follows:

* the click's events run in wiring order: the unqueued press (``run_pressed`` -> ``press``) has
  answered before the Run event is sent, so a handler's press is always counted before it starts;
* a click while the tab's Run event is pending is deferred, and of several only one is kept;
  when the pending event ends, the browser replays that click whole: ``run_pressed`` again, then
  the Run event. The replayed press is not a new press: each press carries the page's count of
  clicks on Run so far (``assets/page.js``), and a replay's count is one ``press`` saw already.
  The server cannot tell a replay by itself: whether the browser deferred a click depends on
  when the end of the pending event reached the browser (after its last outputs were drawn);
* the press and Stop are unqueued and never skipped (``trigger_mode="multiple"``), so the server
  sees them in the order they were clicked (a queued Stop arrived 100 ms or more after a Run
  clicked 80 ms later; with Gradio's default ``"once"`` a click while the button's last event was
  pending was dropped, the last Stop of quick pairs too);
* a cancel (the hidden leave-the-queue button, ZeroGPU only) replays nothing at once; a deferred
  click then waits for the end of some later Run event.

Run and Stop can cross in every order (six quick Run/Stop pairs, say), so the handle keeps each
thing apart instead of one set of flags:

* **presses** are counted, unless a press repeats one whose run goes on, or waits to start, that
  nobody stopped. Stop marks every press made before it;
* a handler that **starts** claims every press not yet claimed and runs for the latest: it ends at
  once ("stopped") when Stop came after that press. One that starts with no press to claim ran
  for a press another handler already claimed, or for a repeat: it is skipped ("repeat"). A
  session that never pressed (an API client) runs;
* the **started run** (a ``Turn``, from ``start``): its ``RunControl`` while it runs, its way out of
  the page's queue while it waits there, and whether Stop reached it. ``queued``, ``attach`` and
  ``finish`` name their turn, so a stopped run that ends late (a generator Gradio closes after
  the next run began) never touches the next run.

What Stop answers tells the page what to do: ``"running"`` (the run stops itself within a step
and says so), ``"waiting"`` (the run is taken out of the page's queue, or its press ends as its
handler starts, and says so), ``"queued"`` (the run waits in Gradio's own queue, which only
happens where Run has a concurrency limit, on ZeroGPU: the page then takes it out with a cancel)
or ``"idle"`` (nothing to stop). Off ZeroGPU the page never cancels a Run event: a cancel reaches
every Run event of the session, the next run's too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from engine.serving.run_control import RunControl

IDLE, QUEUED, WAITING, RUNNING = "idle", "queued", "waiting", "running"  # what Stop found
REPEAT_PRESS, STOPPED_PRESS = "repeat", "stopped"  # why a started handler does not run


@dataclass(eq=False)
class Turn:
    """One started Run handler, as Stop sees it. ``skip``: why it must not run (``"repeat"``: a
    second press during a run; ``"stopped"``: Stop came before it started), else None."""

    skip: str | None = None
    control: RunControl | None = None  # while its engines run
    leave: Callable[[], None] | None = None  # while it waits in the page's queue: takes it out
    stop_requested: bool = False


class RunHandle:
    """A session's presses and its started run; see the module docstring.

    ``gradio_queue``: Run events wait in Gradio's queue before their handler starts (ZeroGPU), so
    Stop of a press not yet started answers ``"queued"``. Gradio deep-copies a state's first value
    for each session; a copy is a fresh handle with the same ``gradio_queue``.
    """

    def __init__(self, gradio_queue: bool = False) -> None:
        self.gradio_queue = gradio_queue
        self._lock = threading.Lock()
        self._num_pressed = 0  # Run presses counted (repeats and replays are not)
        self._num_claimed = 0  # presses a started handler (or a cancel) accounted for
        self._stopped_upto = 0  # Stop came after this many presses
        self._turn: Turn | None = None  # the started run, until its handler finishes
        self._sent = False  # a Run event was sent and its handler has not started
        self._num_clicks = 0  # the highest count of clicks on Run a press carried (page.js)

    def __deepcopy__(self, memo) -> RunHandle:
        return RunHandle(self.gradio_queue)

    @property
    def idle(self) -> bool:
        """No run started and no press waiting to start: Stop has nothing to stop."""
        with self._lock:
            return self._turn is None and not self._pending()

    @property
    def control(self) -> RunControl | None:
        """The started run's ``RunControl`` while its engines run, else None."""
        turn = self._turn
        return None if turn is None else turn.control

    def press(self, num_clicks: int = 0) -> bool:
        """A click on Run (before the browser sends, defers or replays its run); whether its run
        will go: False for a repeat (a press while a run goes on, or waits to start, that nobody
        stopped: not counted) and for the replay of a deferred click whose press Stop marked.

        ``num_clicks``: the page's count of clicks on Run so far; a count seen already is the
        browser's replay of a click it deferred, which sends its Run event now. 0 (no count, as
        from a test or a page without its script): a new click."""
        with self._lock:
            if 0 < num_clicks <= self._num_clicks:  # the replay of a deferred click
                self._sent = True
                return self._will_run()
            self._num_clicks = max(self._num_clicks, num_clicks)
            if self._turn is None:
                self._sent = True  # no Run event pending: the browser sends this one now
            turn = self._turn
            if (turn is not None and not turn.stop_requested) or self._will_run():
                return False
            self._num_pressed += 1
            return True

    def start(self) -> Turn:
        """A Run handler begins: its ``Turn`` (``skip`` says why it must not run, if so); see the
        module docstring."""
        with self._lock:
            self._sent = False
            if self._num_pressed and not self._pending():
                return Turn(skip=REPEAT_PRESS)
            self._num_claimed = self._num_pressed
            if self._num_pressed and self._stopped_upto >= self._num_pressed:
                return Turn(skip=STOPPED_PRESS)
            self._turn = Turn()
            return self._turn

    def queued(self, turn: Turn, leave: Callable[[], None]) -> None:
        """``turn``'s run joined the page's queue (``engine.page.run.run_queue``); ``leave`` takes
        it out (Stop calls it, at once if Stop came already; the run then sees it gone)."""
        with self._lock:
            turn.leave = leave
            if turn.stop_requested:
                leave()

    def attach(self, turn: Turn, control: RunControl) -> None:
        """``turn``'s engines are about to start under ``control`` (stopped at once if Stop came
        in between)."""
        with self._lock:
            turn.control, turn.leave = control, None
            if turn.stop_requested:
                control.stop()

    def finish(self, turn: Turn) -> None:
        """``turn``'s handler ends (done, refused, stopped, failed or closed)."""
        with self._lock:
            if self._turn is turn:
                self._turn = None

    def stop(self) -> str:
        """Stop pressed: stop the started run and mark every press so far; what there was to
        stop (see the module docstring)."""
        with self._lock:
            turn, pending = self._turn, self._pending()
            self._stopped_upto = self._num_pressed
            if turn is not None:
                turn.stop_requested = True
                if turn.control is not None:
                    turn.control.stop()
                    return RUNNING
                if turn.leave is not None:
                    turn.leave()
                return WAITING
            if pending:
                return QUEUED if self.gradio_queue and self._sent else WAITING
            return IDLE

    def left_queue(self) -> None:
        """The page cancelled the session's Run events waiting in Gradio's queue: no press that
        Stop marked will start (a click deferred since is replayed after a later run)."""
        with self._lock:
            self._num_claimed = max(self._num_claimed, self._stopped_upto)
            self._sent = False

    def _pending(self) -> bool:
        """Presses that no handler has claimed yet."""
        return self._num_claimed < self._num_pressed

    def _will_run(self) -> bool:
        """A press waits to start and Stop did not come after it."""
        return self._pending() and self._stopped_upto < self._num_pressed
