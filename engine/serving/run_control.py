"""Run control: how a running comparison is told to stop, by a person or by the clock.

A ``RunControl`` is shared by the thread that runs the engines and the one that serves the page.
The page side calls ``stop()`` (Stop button, closed tab); the engine side calls ``check()`` from its
per-step callback, which raises ``RunCancelled`` or ``RunTimedOut`` so the engine loop unwinds
within one step and drops its KV cache. An engine waiting for arrivals runs no steps, so it waits
through ``wait_until``, which checks between slices. The time limit comes from
``CBP_RUN_TIME_LIMIT_S``, read at every run so a host can change it without a restart.
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
    """The per-run time limit in seconds from ``CBP_RUN_TIME_LIMIT_S``; None when it is off (0).

    Raises:
        ValueError: a value that is set but is not a number >= 0.
    """
    text = settings.value(RUN_TIME_LIMIT_ENV)
    try:
        limit_s = float(text)
    except ValueError:
        limit_s = -1.0
    if not limit_s >= 0 or limit_s == float("inf"):
        raise ValueError(
            f"The environment variable {RUN_TIME_LIMIT_ENV}={text!r} must be a number of "
            "seconds >= 0 (0 turns the limit off)."
        )
    return limit_s or None


class RunControl:
    """A stop flag plus an optional deadline, checked by the engines once per step."""

    def __init__(
        self, time_limit_s: float | None = None, time_left_s: float | None = None, stop=None
    ):
        """``time_left_s``: what is left of ``time_limit_s`` for a run that started elsewhere
        (another process: monotonic clocks are per process), all of it by default. ``stop``: the
        event ``stop()`` sets (another process's, shared), a new one by default."""
        self.time_limit_s = time_limit_s
        self._stop = threading.Event() if stop is None else stop
        left_s = time_limit_s if time_left_s is None else time_left_s
        self._deadline = None if left_s is None else time.monotonic() + left_s

    def time_left_s(self) -> float | None:
        """Seconds left before the time limit (0 once past it); None without a limit."""
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def stop(self) -> None:
        """Ask the run to stop; it raises ``RunCancelled`` at its next ``check()``."""
        self._stop.set()

    def check(self) -> None:
        """Return if the run may go on.

        Raises:
            RunCancelled: ``stop()`` was called.
            RunTimedOut: the time limit has passed.
        """
        if self._stop.is_set():
            raise RunCancelled("the run was cancelled before it finished.")
        if self._deadline is not None and time.monotonic() > self._deadline:
            raise RunTimedOut(
                f"the run took longer than the limit of {self.time_limit_s:g} s "
                f"({RUN_TIME_LIMIT_ENV}); try fewer requests or smaller caps."
            )


def wait_until(t0: float, wake_s: float, on_wait: Callable[[], None] | None = None) -> None:
    """Sleep until ``wake_s`` seconds after ``t0`` (a ``time.perf_counter()`` reading).

    The sleep goes in slices of at most ``WAIT_SLICE_S`` seconds with ``on_wait()`` called after
    each, so a run told to stop ends the wait within one slice. Returns at once when ``wake_s``
    has passed.

    Raises:
        Exception: whatever ``on_wait`` raises (``RunStopped`` from ``RunControl.check``), at once.
    """
    while (left_s := wake_s - (time.perf_counter() - t0)) > 0:
        time.sleep(min(left_s, WAIT_SLICE_S))
        if on_wait is not None:
            on_wait()
