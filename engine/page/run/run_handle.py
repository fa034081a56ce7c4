"""One visitor's run, as Run and Stop see it: pressed, waiting in a queue, running, stopping.

How Run and Stop follow Gradio's click dispatch, and what Stop answers: docs/page.md,
"Run and Stop, click by click".
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
    """One started Run handler; ``skip``: why it must not run ("repeat", "stopped"), else None."""

    skip: str | None = None
    control: Stoppable | None = None  # while its engines run: its ``Run``
    leave: Callable[[], None] | None = None  # while it waits in the page's queue: takes it out
    stop_requested: bool = False
    press_seq: int = 0  # the number of the click it runs for (0: no press, an API client)
    abandoned: bool = False  # its tab closed or reloaded: its results are neither shown nor kept


class RunHandle:
    """A session's presses and its started run. ``gradio_queue``: Run events wait in Gradio's
    queue (ZeroGPU). Per-session copies share ``sessions`` (held weakly) so ``session_ended``
    finds one."""

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
        if session_hash:
            self._sessions[session_hash] = self

    def session_ended(self, session_hash: str | None) -> None:
        """Browser session ``session_hash`` ended (tab closed or reloaded): ``abandon`` its run."""
        handle = self._sessions.pop(session_hash, None) if session_hash else None
        if handle is not None:
            handle.abandon()

    def abandon(self) -> str:
        """Stop this session's run and unstarted presses; mark it ``abandoned`` (never shown)."""
        with self._lock:
            if self._turn is not None:
                self._turn.abandoned = True
            seq = self._seen_seq + 1  # after every click seen: stops them all
        return self.stop(seq)

    @property
    def idle(self) -> bool:
        with self._lock:
            return self._turn is None and not self._pending()

    @property
    def control(self) -> Stoppable | None:
        turn = self._turn
        return None if turn is None else turn.control

    def press(self, seq: int = 0) -> bool:
        """A click on Run numbered ``seq`` (0: on arrival); False when no run will go for it."""
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
        """A Run handler begins; its ``Turn`` says whether it must not run."""
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
        """``turn``'s run joined the page's queue; ``leave`` takes it out (Stop calls it)."""
        with self._lock:
            turn.leave = leave
            if turn.stop_requested:
                leave()

    def attach(self, turn: Turn, control: Stoppable) -> None:
        """``turn``'s engines start under ``control`` (stopped at once if Stop came)."""
        with self._lock:
            turn.control, turn.leave = control, None
            if turn.stop_requested:
                control.stop()

    def finish(self, turn: Turn) -> None:
        with self._lock:
            if self._turn is turn:
                self._turn = None

    def stop(self, seq: int = 0) -> str:
        """Stop pressed, numbered ``seq`` (0: on arrival): what there was to stop."""
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
        """The page cancelled the session's Run events in Gradio's queue."""
        with self._lock:
            if self._press_seq < self._stop_seq:
                self._claimed_seq = max(self._claimed_seq, self._press_seq)
            self._sent = False

    def _number(self, seq: int) -> int:
        seq = seq if seq > 0 else self._seen_seq + 1
        self._seen_seq = max(self._seen_seq, seq)
        return seq

    def _pending(self) -> bool:
        return self._claimed_seq < self._press_seq

    def _skip(self) -> str | None:
        """Why the latest press's run must not go (None: it goes): a later Stop, or a repeat."""
        if self._stop_seq > self._press_seq:
            return STOPPED_PRESS
        during = self._pressed_during
        if during is not None and self._stop_seq < during:
            return REPEAT_PRESS
        return None
