"""The one thread that makes every torch call of the page: the model load, the warm-up, each run.

torch's CPU kernels run on GNU libgomp's OpenMP thread pools: one pool per thread that starts
parallel work, kept as long as that thread lives. Loading the model in the main thread and running
each comparison in a fresh worker thread would give every run two pools. On a 2-CPU machine that
is more OpenMP threads than CPUs, and libgomp then cuts each wait's spin from 300,000 loops to
100 (1,000 with ``OMP_WAIT_POLICY=ACTIVE``, ``engine.model.openmp_env``), so nearly every one of a
step's ~200 parallel regions would pay a sleep and a wake-up; the bench does all of it in its main
thread, one pool. ``ENGINE_THREAD.submit(fn)`` runs ``fn`` on one long-lived daemon
thread, made at first use, so the page has one pool too. Only one call runs at a time; the page's
runs take the model's lock anyway. With the engine process (``engine_process``, ``app.py``'s
default) the page's engine thread loads the page's model and waits for the worker's answers; the
worker's main thread ``adopt``s the role in its own process.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class EngineThread:
    """A daemon thread that runs submitted calls one after the other, in submission order."""

    def __init__(self, name: str = "cbp-engine"):
        self.name = name
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._adopted = False  # the thread is one that called ``adopt``: no loop serves calls

    @property
    def ident(self) -> int | None:
        """The thread's ``threading.get_ident()``, or None before the first call."""
        return None if self._thread is None else self._thread.ident

    def adopt(self) -> None:
        """Make the calling thread the engine thread, so ``call`` runs directly on it.

        For a process whose main thread makes every torch call itself (the engine process,
        ``engine.page.run.engine_process``): ``in_dtype`` and the loads then stay on that thread
        and its one OpenMP pool. Nothing may ``submit`` afterwards (no loop serves the queue).
        """
        with self._lock:
            assert self._thread is None, "the engine thread already runs"
            self._thread = threading.current_thread()
            self._adopted = True

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Queue ``fn(*args)``; the future holds its value, or what it raised."""
        future: Future = Future()
        assert not self._adopted, "submit() on an adopted engine thread: call() instead"
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()
        self._calls.put((future, fn, args))
        return future

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the thread, waiting for it (directly when already on the thread).

        Raises:
            Exception: whatever ``fn`` raised.
        """
        if threading.get_ident() == self.ident:
            return fn(*args)
        return self.submit(fn, *args).result()

    def _loop(self) -> None:
        while True:
            future, fn, args = self._calls.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to the caller through the future
                future.set_exception(exc)
            del future, fn, args  # nothing of a finished call stays alive while the thread waits


ENGINE_THREAD = EngineThread()  # the page's one engine thread
