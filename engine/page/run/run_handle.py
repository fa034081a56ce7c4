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
  the Run event;
* a cancel (the hidden leave-the-queue button, ZeroGPU only) replays nothing at once; a deferred
  click then waits for the end of some later Run event.

**Click order.** The press and Stop are unqueued and never skipped (``trigger_mode="multiple"``:
with Gradio's default ``"once"`` a click while the button's last event was pending is dropped).
Still, under load a Stop clicked moments after a Run can be handled before that Run's press. So
the page numbers its clicks on Run and Stop in one sequence (``assets/page.js``), each press and
Stop carries its click's number (``seq``; without one, a test or a page without its script, it is
numbered on arrival), and the handle decides by these numbers, not by arrival:

* a Stop stops every press numbered before it, and the run started for one; not a later one;
* a press whose number was seen already is the browser's replay of the click it deferred, not a
  new press (the server cannot tell a replay by itself: whether the browser deferred a click
  depends on when the end of the pending event reached the browser);
* a press made while a run goes on (or waits to start) is a **repeat** unless a Stop numbered
  between that run's press and it came: decided when a handler starts, as a Stop may arrive late.

A handler that **starts** claims every press not yet claimed and runs for the latest, unless
``start`` says why not (``Turn.skip``); a session that never pressed (an API client) runs.
``queued``, ``attach`` and ``finish`` name their ``Turn``, so a stopped run that ends late (a
generator Gradio closes after the next run began) never touches the next run.

What Stop answers tells the page what to do (``stop``): ``"running"`` (the run stops itself
within a step and says so), ``"waiting"`` (the run is taken out of the page's queue, or its press
ends as its handler starts; also a Stop older than the run going on, which it leaves alone),
``"queued"`` (the run waits in Gradio's own queue, which only happens where Run has a concurrency
limit, on ZeroGPU: the page then takes it out with a cancel) or ``"idle"``. Off ZeroGPU the page
never cancels a Run event: a cancel reaches every Run event of the session, the next run's too.

A tab that goes away (closed or reloaded) ends its session, and Gradio calls ``demo.unload``'s
handler, which stops its run as Stop would (``session_ended``).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

IDLE, QUEUED, WAITING, RUNNING = "idle", "queued", "waiting", "running"  # what Stop found
REPEAT_PRESS, STOPPED_PRESS = "repeat", "stopped"  # why a started handler does not run


class Stoppable(Protocol):
    """What Stop stops while a run's engines run (``engine.page.run.run.Run``)."""

    def stop(self) -> None: ...


@dataclass(eq=False)
class Turn:
    """One started Run handler, as Stop sees it. ``skip``: why it must not run (``"repeat"``: a
    second press during a run; ``"stopped"``: Stop came before it started), else None."""

    skip: str | None = None
    control: Stoppable | None = None  # while its engines run: its ``Run``
    leave: Callable[[], None] | None = None  # while it waits in the page's queue: takes it out
    stop_requested: bool = False
    press_seq: int = 0  # the number of the click it runs for (0: no press, an API client)
    abandoned: bool = False  # its tab closed or reloaded: its results are neither shown nor kept


class RunHandle:
    """A session's presses and its started run; see the module docstring.

    ``gradio_queue``: Run events wait in Gradio's queue before their handler starts (ZeroGPU), so
    Stop of a press not yet started answers ``"queued"``. Gradio deep-copies a state's first value
    for each session; a copy is a fresh handle with the same ``gradio_queue`` and the same
    ``sessions``: the handles of the sessions that pressed Run, by Gradio's session hash (held
    weakly: Gradio's own state keeps a session's handle), so that ``session_ended`` finds one.
    """

    def __init__(self, gradio_queue: bool = False, sessions=None) -> None:
        self.gradio_queue = gradio_queue
        self._sessions = weakref.WeakValueDictionary() if sessions is None else sessions
        self._lock = threading.Lock()
        self._seen_seq = 0  # the highest click number of a press or Stop seen
        self._press_seq = 0  # the latest press's click number (replays are not presses)
        self._pressed_during: int | None = None  # it came while the run for this press went on
        self._claimed_seq = 0  # presses up to this number a handler (or a cancel) accounted for
        self._stop_seq = 0  # the latest Stop's click number
        self._turn: Turn | None = None  # the started run, until its handler finishes
        self._sent = False  # a Run event was sent and its handler has not started

    def __deepcopy__(self, memo) -> RunHandle:
        return RunHandle(self.gradio_queue, self._sessions)

    def joined(self, session_hash: str | None) -> None:
        """This handle is the one of the browser session ``session_hash`` (a press names it)."""
        if session_hash:
            self._sessions[session_hash] = self

    def session_ended(self, session_hash: str | None) -> None:
        """The browser session ``session_hash`` ended (its tab closed or reloaded): its handle's
        run is abandoned (``abandon``). Any handle of the page finds any session's."""
        handle = self._sessions.pop(session_hash, None) if session_hash else None
        if handle is not None:
            handle.abandon()

    def abandon(self) -> str:
        """Nobody sees this session's run any more: stop it as Stop would (the run ends within an
        engine step, or leaves the page's queue), also every press not yet started, and mark it
        ``abandoned`` so that its results, should it finish first, are never shown or kept."""
        with self._lock:
            if self._turn is not None:
                self._turn.abandoned = True
            seq = self._seen_seq + 1  # after every click seen: stops them all
        return self.stop(seq)

    @property
    def idle(self) -> bool:
        """No run started and no press waiting to start: Stop has nothing to stop."""
        with self._lock:
            return self._turn is None and not self._pending()

    @property
    def control(self) -> Stoppable | None:
        """The started run (what Stop stops) while its engines run, else None."""
        turn = self._turn
        return None if turn is None else turn.control

    def press(self, seq: int = 0) -> bool:
        """A click on Run (before the browser sends, defers or replays its run), numbered ``seq``
        in the page's sequence of clicks (0: numbered on arrival); whether a run will go for it:
        False for a repeat (see the module docstring), for a press that joins a run waiting to
        start for an earlier one (one run goes, for the latest) and for a press a Stop came
        after."""
        with self._lock:
            if 0 < seq <= self._seen_seq and seq == self._press_seq:  # a deferred click's replay
                self._sent = True
                return self._pending() and self._skip() is None
            seq, turn = self._number(seq), self._turn
            # A run waits to start for an earlier press that no Stop marked: this press joins it.
            waiting = turn is None and self._pending() and self._skip() is None
            if turn is None:
                self._sent = True  # no Run event pending: the browser sends this one now
            if seq > self._press_seq:
                self._press_seq = seq
                self._pressed_during = None if turn is None else turn.press_seq
            return self._skip() is None and not waiting

    def start(self) -> Turn:
        """A Run handler begins: its ``Turn`` (``skip`` says why it must not run, if so); see the
        module docstring."""
        with self._lock:
            self._sent = False
            if self._press_seq and not self._pending():
                return Turn(skip=REPEAT_PRESS)
            skip = self._skip()
            self._claimed_seq = self._press_seq
            if skip is not None:
                return Turn(skip=skip)
            self._turn = Turn(press_seq=self._press_seq)
            return self._turn

    def queued(self, turn: Turn, leave: Callable[[], None]) -> None:
        """``turn``'s run joined the page's queue (``engine.page.run.run_queue``); ``leave`` takes
        it out (Stop calls it, at once if Stop came already; the run then sees it gone)."""
        with self._lock:
            turn.leave = leave
            if turn.stop_requested:
                leave()

    def attach(self, turn: Turn, control: Stoppable) -> None:
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

    def stop(self, seq: int = 0) -> str:
        """Stop pressed, numbered ``seq`` in the page's sequence of clicks (0: numbered on
        arrival): stop the started run and mark every press before it; what there was to stop
        (see the module docstring)."""
        with self._lock:
            seq = self._number(seq)
            self._stop_seq = max(self._stop_seq, seq)
            turn, pending = self._turn, self._pending()
            if turn is not None and turn.press_seq < seq:
                turn.stop_requested = True
                if turn.control is not None:
                    turn.control.stop()
                    return RUNNING
                if turn.leave is not None:
                    turn.leave()
                return WAITING
            if turn is not None or (pending and self._press_seq > seq):
                return WAITING  # a Stop older than the run, or the press, it found: left alone
            if pending:
                return QUEUED if self.gradio_queue and self._sent else WAITING
            return IDLE

    def left_queue(self) -> None:
        """The page cancelled the session's Run events waiting in Gradio's queue: no press that
        Stop marked will start (a click deferred since is replayed after a later run)."""
        with self._lock:
            if self._press_seq < self._stop_seq:
                self._claimed_seq = max(self._claimed_seq, self._press_seq)
            self._sent = False

    def _number(self, seq: int) -> int:
        """A click's number: ``seq``, or for an unnumbered one the next on arrival."""
        seq = seq if seq > 0 else self._seen_seq + 1
        self._seen_seq = max(self._seen_seq, seq)
        return seq

    def _pending(self) -> bool:
        """A press that no handler has claimed yet."""
        return self._claimed_seq < self._press_seq

    def _skip(self) -> str | None:
        """Why the run for the latest press must not go (None: it goes): a Stop after it, or a
        repeat (made while a run went on that no Stop numbered before it stopped)."""
        if self._stop_seq > self._press_seq:
            return STOPPED_PRESS
        during = self._pressed_during
        if during is not None and self._stop_seq < during:
            return REPEAT_PRESS
        return None
