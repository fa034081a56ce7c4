"""Recent runs on this host, by setup: a Run identical to one measured minutes ago is shown at once,
labelled (the same setup on the same host gives the same tokens and schedule; only timings move).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from engine import settings

DEFAULT_WINDOW_S = float(settings.default("CBP_REPLAY_WINDOW_S"))
MAX_RUNS = 32  # setups kept; the least recently measured goes first


def replay_window_s(environ=None) -> float:
    """``CBP_REPLAY_WINDOW_S`` in seconds; raises ValueError for anything but seconds >= 0."""
    return settings.number("CBP_REPLAY_WINDOW_S", environ)


@dataclass(frozen=True)
class RecentRun:
    """A finished run kept for its setup: rendered state, downloads, ``measured_at`` (epoch s)."""

    state: Any
    downloads: list[str] | None
    measured_at: float
    # what ``drawn`` drew of it, by key (an x axis), and the lock its draws take turns under
    _drawings: dict = field(default_factory=dict, compare=False, repr=False)
    _drawing: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    def drawn(self, key: Hashable, draw: Callable[[], Any]) -> Any:
        """``draw()``, made once per ``key`` and kept (callers must not change it)."""
        with self._drawing:  # a second person waits for the first draw instead of repeating it
            if key not in self._drawings:
                self._drawings[key] = draw()
            return self._drawings[key]


@dataclass
class RecentRuns:
    """The latest finished run of each setup, for ``window_s`` seconds (0: none is kept)."""

    window_s: float = DEFAULT_WINDOW_S
    clock: Callable[[], float] = time.time
    max_runs: int = MAX_RUNS
    _runs: OrderedDict = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def keep(self, key: Hashable, state: Any, downloads: list[str] | None = None) -> None:
        if self.window_s <= 0:
            return
        with self._lock:
            self._runs.pop(key, None)
            self._runs[key] = RecentRun(state, downloads, self.clock())
            while len(self._runs) > self.max_runs:
                self._runs.popitem(last=False)

    def find(self, key: Hashable) -> RecentRun | None:
        with self._lock:
            run = self._runs.get(key)
            if run is not None and self.clock() - run.measured_at > self.window_s:
                del self._runs[key]
                return None
            return run

    def age_s(self, run: RecentRun) -> float:
        return max(0.0, self.clock() - run.measured_at)


def replay_label(run: RecentRun, age_s: float) -> str:
    """E.g. "measured at 14:02 on this host, 3 min ago, identical setup" (host's local time)."""
    at = time.strftime("%H:%M", time.localtime(run.measured_at))
    ago = f"{age_s:.0f} s ago" if age_s < 60 else f"{age_s / 60:.0f} min ago"
    return f"measured at {at} on this host, {ago}, identical setup"
