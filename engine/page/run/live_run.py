"""A live run: the engines on the engine thread, watched step by step, so the page can stream.

The Run handler is a generator. It cannot call the engines itself: Gradio stops a generator only
between two of its yields (Stop button, closed tab), and a run can last minutes. So ``LiveRun``
runs the work on the page's engine thread (``engine.page.run.engine_thread``: the one thread that
also loaded the model, so torch has one OpenMP pool, as in the bench), and the handler polls it
every fraction of a second and yields what it sees. The work calls ``watch(engine, trace)`` after
every engine step, and ``watch(engine, trace, waiting=True)`` every fraction of a second while an
engine waits for requests to arrive; ``watch`` checks the ``RunControl`` (raising ``RunCancelled``
or ``RunTimedOut``, which unwinds the engine within one step or wait slice) and keeps a cheap
snapshot of the engine's trace for the page.

With the engine process (``engine.page.run.engine_process``) the work on the engine thread only
waits for it: the worker keeps its progress with a ``LiveRun`` of its own and sends each entry,
which ``watch(..., entry=...)`` takes as it is, so the page's side reads the same progress.

A stopped run keeps no reference to its engines, so their KV cache is freed as the work ends.
"""

from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.page.run.engine_thread import ENGINE_THREAD
from engine.serving.run_control import RunControl, RunStopped
from engine.trace import Trace

SNAPSHOT_INTERVAL_S = 0.5  # trace snapshots per engine: this often, and when a request finishes


@dataclass
class EngineProgress:
    """How far one engine got: steps done, requests finished, and its trace so far."""

    name: str
    num_steps: int = 0
    num_finished: int = 0
    num_requests: int = 0
    trace: Trace | None = None  # a snapshot: every finished request in, steps <= 0.5 s old
    waiting: bool = False  # the engine is waiting for requests to arrive
    note: str | None = None  # what a server engine is waiting for ("starting the server (12 s)")


def snapshot(trace: Trace) -> Trace:
    """A copy of ``trace`` that later steps of the engine cannot change.

    Steps are never changed once appended and request records get new output lists when they
    finish, so copying the lists and each request record is enough (no deep copy).
    """
    return dataclasses.replace(
        trace,
        steps=list(trace.steps),
        requests=[copy.copy(r) for r in trace.requests],
        info=dict(trace.info),
    )


class LiveRun:
    """Runs ``work(watch)`` on the engine thread; see the module docstring.

    Use it as a context manager: leaving the block (also by ``GeneratorExit`` when Gradio closes
    the handler) asks the worker to stop at its next step.

    ``on_progress(progress)``, if given, is called with ``progress()`` after each ``watch``, on the
    thread that watches: the queue learns the run's steps as they are done, not when the page's
    handler next gets to run: a room's joins can keep the page's CPU so busy that reports
    through the handler come tens of seconds late, and the estimates with them. It must be quick
    and must not raise.
    """

    def __init__(
        self,
        work: Callable[[Callable], Any],
        control: RunControl,
        on_progress: Callable[[dict[str, EngineProgress]], None] | None = None,
    ):
        self.control = control
        self._work = work
        self._on_progress = on_progress
        self._lock = threading.Lock()
        self._progress: dict[str, EngineProgress] = {}
        self._last_snapshot_s: dict[str, float] = {}
        self._value: Any = None
        self._error: BaseException | None = None
        self._future: concurrent.futures.Future | None = None

    def __enter__(self) -> LiveRun:
        self._future = ENGINE_THREAD.submit(self._main)
        return self

    def __exit__(self, *exc_info) -> None:
        self.control.stop()  # no-op for a finished run; the worker ends within one step otherwise

    def watch(
        self,
        engine: str,
        trace: Trace | None,
        done: bool = False,
        waiting: bool = False,
        note: str | None = None,
        entry: EngineProgress | None = None,
    ) -> None:
        """Called by the work after each step of ``engine``, with ``done`` after its last, and with
        ``waiting`` (no step ran) while it waits for requests to arrive or for a server (``note``
        says what for; a server engine's trace comes with it as its streams go). An ``entry``
        kept elsewhere (the engine process's, ``engine.page.run.engine_process``) is taken as it
        is, its trace None when the last one sent still holds.

        Raises:
            RunStopped: the run should stop (see ``RunControl.check``).
        """
        self.control.check()
        if entry is not None:
            self._take(entry)
        else:
            self._keep(engine, trace, done, waiting, note)
        if self._on_progress is not None:
            self._on_progress(self.progress())

    def _keep(
        self, engine: str, trace: Trace | None, done: bool, waiting: bool, note: str | None
    ) -> None:
        """Count a step (or a wait) of ``engine`` and keep a snapshot of its ``trace`` when due."""
        now_s = time.monotonic()
        with self._lock:
            entry = self._progress.setdefault(engine, EngineProgress(engine))
            entry.waiting = waiting
            entry.note = note
            if done and trace is not None:
                entry.num_steps = len(trace.steps)
            elif not waiting:
                entry.num_steps += 1
            if trace is None:  # the reference or transformers' engine: no trace to show
                return
            entry.num_requests = len(trace.requests)
            num_finished = sum(r.finish_s is not None for r in trace.requests)
            newly_finished, entry.num_finished = num_finished != entry.num_finished, num_finished
            last_s = self._last_snapshot_s.get(engine, -math.inf)
            if done or newly_finished or now_s - last_s >= SNAPSHOT_INTERVAL_S:
                entry.trace = snapshot(trace)
                self._last_snapshot_s[engine] = now_s

    def _take(self, entry: EngineProgress) -> None:
        with self._lock:
            kept = self._progress.get(entry.name)
            if entry.trace is None and kept is not None:
                entry = dataclasses.replace(entry, trace=kept.trace)
            self._progress[entry.name] = entry

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds; True once the work ended (done, failed or stopped)."""
        assert self._future is not None, "wait() outside the with block"
        concurrent.futures.wait([self._future], timeout_s)
        return self._future.done()

    def progress(self) -> dict[str, EngineProgress]:
        """Each engine's progress so far, by engine name, in the order they started."""
        with self._lock:
            return {name: copy.copy(p) for name, p in self._progress.items()}

    def result(self) -> Any:
        """The work's return value, once ``wait`` returned True.

        Raises:
            RunStopped: the run was cancelled or timed out.
            Exception: whatever the work raised.
        """
        assert self._future is not None and self._future.done(), "result() before the run ended"
        if self._error is not None:
            raise self._error
        return self._value

    def _main(self) -> None:
        try:
            self._value = self._work(self.watch)
        except RunStopped as exc:
            # A fresh exception: the caught one's traceback holds the engine frames, and with them
            # the KV cache, for as long as it is kept.
            self._error = type(exc)(str(exc))
        except BaseException as exc:  # handed to the page thread by result()
            self._error = exc
