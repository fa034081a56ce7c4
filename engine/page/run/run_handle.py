"""One visitor's run, as Run and Stop see it: pressed, waiting in the queue, running, stopping.

Stop does not cancel the Run event through Gradio (``cancels=``): a cancel waits for the handler's
current poll to return, and until it does the browser silently drops another Run press (Gradio's
``trigger_mode="once"``) and may lay an "Error" badge over the status line. Instead each session
keeps a ``RunHandle`` in a ``gr.State``; Stop (an event that waits for no other) sets the
stop flag of the run's own ``RunControl``, and the run ends itself within one engine step and
says so. Run's event uses ``trigger_mode="always_last"``: a press while the previous run is still
stopping is kept by the browser and starts the moment that run ends. ``press`` tells apart a press
after Stop (it starts) from a second press while a run goes on (ignored, as Gradio did before).

A run still waiting in the queue has no engines to stop: Stop marks it (``stop`` answers
``"queued"``) and the page then takes it out of Gradio's queue, which is immediate for an event that
has not started.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from engine.serving.run_control import RunControl

IDLE, QUEUED, RUNNING = "idle", "queued", "running"


class RunHandle:
    """A session's run: whether one was pressed, its ``RunControl`` while it runs, and flags.

    Gradio deep-copies a state's first value for each session; a copy is a fresh handle.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pressed = False  # a Run press was accepted and its run has not ended
        self.control: RunControl | None = None  # the running run's, None before it starts
        self.stop_requested = False
        self.ignore_next = False  # the next run to start is a second press during a run: skip it
        self._leave_queue = None  # while the run waits in the page's queue: takes it out

    def __deepcopy__(self, memo) -> RunHandle:
        return RunHandle()

    def press(self) -> None:
        """A Run press (before the browser sends or defers the run): a press while a run goes on
        and nobody pressed Stop is a repeat, and its deferred run will be skipped."""
        with self._lock:
            if self.pressed and not self.stop_requested:
                self.ignore_next = True
            self.pressed = True

    def start(self) -> str | None:
        """The run's handler begins; None if it should run, else why not (``"repeat"``: a second
        press during a run; ``"stopped"``: Stop was pressed while it waited in the queue)."""
        with self._lock:
            if self.ignore_next:
                self.ignore_next = False
                return "repeat"
            if self.stop_requested:
                self._reset()
                return "stopped"
            self.pressed = True
            return None

    def queued(self, leave: Callable[[], None]) -> None:
        """The run joined the page's queue (``engine.page.run.run_queue``); ``leave`` takes it out
        (Stop calls it; the run's handler then sees it gone and says so)."""
        with self._lock:
            self._leave_queue = leave

    def attach(self, control: RunControl) -> None:
        """The run's engines are about to start under ``control`` (stopped at once if Stop came
        in between)."""
        with self._lock:
            self.control = control
            if self.stop_requested:
                control.stop()

    def finish(self) -> None:
        """The run's handler ends (done, refused, stopped or failed)."""
        with self._lock:
            self._reset()

    def stop(self) -> str:
        """Stop pressed: stop the running run, or mark the queued one; what there was to stop."""
        with self._lock:
            if self.control is not None:
                self.stop_requested = True
                self.control.stop()
                return RUNNING
            if self.pressed:
                self.stop_requested = True
                if self._leave_queue is not None:
                    self._leave_queue()
                return QUEUED
            return IDLE

    def left_queue(self) -> None:
        """The queued run was taken out of Gradio's queue: it never starts."""
        with self._lock:
            self._reset()
            self.ignore_next = False

    def _reset(self) -> None:
        self.pressed, self.control, self.stop_requested = False, None, False
        self._leave_queue = None
