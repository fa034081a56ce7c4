"""Run control: a running comparison told to stop, by a person (``stop()``) or by the clock. The
engines' per-step ``check()`` raises ``RunCancelled`` or ``RunTimedOut``, unwinding within a step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from engine import settings

RUN_TIME_LIMIT_ENV = "CBP_RUN_TIME_LIMIT_S"  # 0 turns the limit off
WAIT_SLICE_S = 0.05  # the longest sleep between two stop checks while an engine waits


class RunStopped(Exception):
    """A run ended before its work was done; the message says why, for a person."""


class RunCancelled(RunStopped):
    """The user pressed Stop or closed the page."""


class RunTimedOut(RunStopped):
    """The run passed the per-run time limit."""


def run_time_limit_s() -> float | None:
    """``CBP_RUN_TIME_LIMIT_S``; None when off (0). Raises ValueError: not seconds >= 0."""
    return settings.number(RUN_TIME_LIMIT_ENV) or None


class RunControl:
    def __init__(
        self, time_limit_s: float | None = None, time_left_s: float | None = None, stop=None
    ):
        """``time_left_s``: what is left of ``time_limit_s`` for a run started in another process
        (monotonic clocks are per process). ``stop``: the event ``stop()`` sets (maybe shared)."""
        self.time_limit_s = time_limit_s
        self._stop = threading.Event() if stop is None else stop
        left_s = time_limit_s if time_left_s is None else time_left_s
        self._deadline = None if left_s is None else time.monotonic() + left_s

    def time_left_s(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def start_clock(self) -> None:
        """The run begins now: its whole ``time_limit_s`` is left (a wait in a queue before it
        never counts)."""
        if self.time_limit_s is not None:
            self._deadline = time.monotonic() + self.time_limit_s

    def stop(self) -> None:
        self._stop.set()

    def check(self) -> None:
        """Return if the run may go on. Raises RunCancelled: ``stop()`` was called; RunTimedOut: the
        time limit has passed."""
        if self._stop.is_set():
            raise RunCancelled("the run was cancelled before it finished.")
        if self._deadline is not None and time.monotonic() > self._deadline:
            raise RunTimedOut(
                f"the run took longer than the limit of {self.time_limit_s:g} s "
                f"({RUN_TIME_LIMIT_ENV}); try fewer requests or smaller caps."
            )


def wait_until(t0: float, wake_s: float, on_wait: Callable[[], None] | None = None) -> None:
    """Sleep until ``wake_s`` seconds after ``t0`` (``perf_counter``), in slices of ``WAIT_SLICE_S``
    with ``on_wait()`` after each. Raises whatever ``on_wait`` raises, at once."""
    while (left_s := wake_s - (time.perf_counter() - t0)) > 0:
        time.sleep(min(left_s, WAIT_SLICE_S))
        if on_wait is not None:
            on_wait()
