"""The engine thread: one thread per process makes every torch call, so torch keeps one OpenMP
pool (what a second costs: ``engine.model.openmp_env``)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class EngineThread:
    """A daemon thread that runs submitted calls in submission order."""

    def __init__(self, name: str = "cbp-engine"):
        self.name = name
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._adopted = False  # the thread is one that called ``adopt``: no loop serves calls

    @property
    def ident(self) -> int | None:
        return None if self._thread is None else self._thread.ident

    def on_it(self) -> bool:
        return threading.get_ident() == self.ident

    def adopt(self) -> None:
        """Make the calling thread the engine thread (the worker process's main thread), so
        ``call`` runs directly on it. Nothing may ``submit`` afterwards."""
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
        """``fn(*args)`` on the thread, waiting for it (directly when on it); raises what ``fn``
        raised."""
        if self.on_it():
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
