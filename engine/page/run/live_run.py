"""A live run as the page sees it: its work on the engine thread, its progress as it comes.

The Run handler is a generator. It cannot call the engines itself: Gradio stops a generator only
between two of its yields (Stop button, closed tab), and a run can last minutes. So ``LiveRun``
runs the work on the page's engine thread (``engine.worker.worker_process.ENGINE_THREAD``), and
the handler polls it every fraction of a second and yields what it sees. The work sends its jobs
to the model's worker (``engine.worker.worker_process``) with ``take`` as the receiver of each
engine's progress.

A stopped run keeps no reference to its engines, so their KV cache is freed as the work ends.
"""

from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from engine.serving.run_control import RunControl, RunStopped
from engine.worker.progress import EngineProgress
from engine.worker.worker_process import ENGINE_THREAD


class LiveRun:
    """Runs ``work(take)`` on the engine thread; see the module docstring.

    Use it as a context manager: leaving the block (also by ``GeneratorExit`` when Gradio closes
    the handler) stops ``control``, so the engines stop at their next step.

    ``on_progress(progress)``, if given, is called with ``progress()`` after each ``take``, on
    the thread that takes, so the queue learns the run's steps as they are done, not when the
    page's handler next gets to run (a busy page can delay that by tens of seconds). It must be
    quick and must not raise.
    """

    def __init__(
        self,
        work: Callable[[Callable[[EngineProgress], None]], Any],
        control: RunControl,
        on_progress: Callable[[dict[str, EngineProgress]], None] | None = None,
    ):
        self.control = control
        self._work = work
        self._on_progress = on_progress
        self._lock = threading.Lock()
        self._progress: dict[str, EngineProgress] = {}
        self._value: Any = None
        self._error: BaseException | None = None
        self._future: concurrent.futures.Future | None = None

    def __enter__(self) -> LiveRun:
        self._future = ENGINE_THREAD.submit(self._main)
        return self

    def __exit__(self, *exc_info) -> None:
        self.control.stop()  # no-op for a finished run; the worker ends within one step otherwise

    def take(self, entry: EngineProgress) -> None:
        """Keep ``entry`` as its engine's progress (its trace None: the last one still holds)."""
        with self._lock:
            kept = self._progress.get(entry.name)
            if entry.trace is None and kept is not None:
                entry = dataclasses.replace(entry, trace=kept.trace)
            self._progress[entry.name] = entry
        if self._on_progress is not None:
            self._on_progress(self.progress())

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
            self._value = self._work(self.take)
        except RunStopped as exc:
            # A fresh exception: the caught one's traceback holds the engine frames, and with them
            # the KV cache, for as long as it is kept.
            self._error = type(exc)(str(exc))
        except BaseException as exc:  # handed to the page thread by result()
            self._error = exc
