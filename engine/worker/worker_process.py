"""The process transport: a worker in a process of its own, on CPUs of its own, both its ends. The
page's Python holds the GIL the engines need between torch calls; a process keeps it off a run
(docs/measurements.md, "Does the room slow the run being measured?")."""

from __future__ import annotations

import importlib
import importlib.machinery
import multiprocessing
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.serving.run_control import RunControl, RunStopped
from engine.worker.progress import Take
from engine.worker.transport import Job, run_to_end
from engine.worker.worker_main import worker_main

STOP_GRACE_S = 30.0  # a stopped worker answers within a step; past this it is ended


class EngineProcessLost(RunStopped):
    """The engine process ended (killed, out of memory) before it answered; the message says how."""


@dataclass(frozen=True)
class ModelSpec:
    """What the worker loads: ``load_spec``'s ``model``, ``device`` and ``dtype``."""

    load: Callable[[ModelSpec], Any]
    model: str | None = None
    device: str | None = None
    dtype: str | None = None
    # modules the jobs' functions live in, imported before the worker says it is ready, so the
    # first run does not wait for them (the page's: ``engine.worker.comparison``, ``model_facts``)
    preload: tuple[str, ...] = ()


class ProcessWorker:
    """The page's end of one worker process, started by *spawn* (a fork would copy torch's and
    OpenMP's threads' held locks) without the page's main script. One job at a time."""

    def __init__(self, spec: ModelSpec, cpus: tuple[int, ...] | None = None):
        self.spec = spec
        self.cpus = cpus  # the worker's CPUs, a torch thread each (pin_process); None: the page's
        self._context = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()  # held by the job under way
        self._process = None
        self._conn = None
        self._stop = None
        self._ready = False
        self._abandoned: _ProcessJob | None = None  # closed before its answer: read it first

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def start(self) -> None:
        """Start the worker unless one lives; it loads the model while the caller goes on."""
        with self._lock:
            self._start()

    def wait_ready(self) -> None:
        """Start the worker unless one lives; wait until its model is loaded and warm. Raises
        EngineProcessLost (the worker ended first), or the exception its model's load raised."""
        with self._lock:
            self._start()
            while not self._ready:
                self._take_status(self._receive())

    def submit(self, fn: Callable, args: tuple, control: RunControl, take: Take) -> Job:
        """``transport.Worker.submit`` in the worker process (started first if none lives)."""
        self._lock.acquire()
        try:
            self._settle()
            self._start()
            self._stop.clear()
            self._conn.send(((fn, args), control.time_limit_s, control.time_left_s()))
        except BaseException:
            self._lock.release()
            raise
        return _ProcessJob(self, control, take)

    def run(self, fn: Callable, args: tuple, control: RunControl, take: Take) -> Any:
        return run_to_end(self.submit(fn, args, control, take))

    def close(self) -> None:
        self._discard()

    def _start(self) -> None:
        if self._process is not None and self._process.is_alive():
            return
        self._discard()
        here, there = self._context.Pipe()
        self._stop = self._context.Event()
        self._process = self._context.Process(
            target=worker_main,
            args=(self.spec, there, self._stop, self.cpus),
            name="cbp-engine-process",
            daemon=True,
        )
        _start_without_main(self._process)
        there.close()  # the worker's end: a dead worker then reads as end of file here
        self._conn, self._ready = here, False

    def _take_status(self, message: tuple) -> None:
        """A ``("ready", None)`` or ``("failed", exception)`` from the worker's start (raises the
        latter)."""
        kind, payload = message
        if kind == "failed":
            self._discard()
            raise payload
        self._ready = self._ready or kind == "ready"

    def _settle(self) -> None:
        """Read a closed job's late answer, so the next job's messages are its own."""
        job, self._abandoned = self._abandoned, None
        if job is None or self._conn is None:
            return
        deadline_s = time.monotonic() + STOP_GRACE_S
        try:
            while self._conn.poll(max(0.0, deadline_s - time.monotonic())):
                if self._receive()[0] in ("done", "error", "failed"):
                    return
        except EngineProcessLost:
            return
        self._discard()

    def _receive(self) -> tuple:
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            raise self._lost() from None

    def _lost(self) -> EngineProcessLost:
        """Why the worker is gone, for the page; it is let go, so the next run starts another."""
        self._process.join(1.0)
        code = self._process.exitcode
        self._discard()
        if code is not None and code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else -code
            how = f"it was killed ({name}{', out of memory?' if code == -9 else ''})"
        else:
            how = f"it exited with code {code}"
        return EngineProcessLost(
            f"the engine process ended during the run: {how}. The next run starts a fresh one."
        )

    def _discard(self) -> None:
        """Let the worker go: ended if it lives, its pipe closed."""
        if self._process is not None and self._process.is_alive():
            self._process.terminate()
            self._process.join(5.0)
        if self._conn is not None:
            self._conn.close()
        self._process, self._conn, self._ready = None, None, False
        self._stop = None  # its semaphore goes with it (a new worker gets a new event)


class _ProcessJob(Job):
    """A job sent to the worker process, holding the worker's lock until its answer; once
    ``control`` stops, a worker not answering within ``STOP_GRACE_S`` is ended."""

    def __init__(self, worker: ProcessWorker, control: RunControl, take: Take):
        super().__init__(take)
        self._worker, self._control = worker, control
        self._stop_event = worker._stop
        self._stopped: RunStopped | None = None
        self._deadline_s = float("inf")
        self._held = True

    def stop(self) -> None:
        self._control.stop()
        self._stop_event.set()  # at once: Stop's own thread calls this

    def close(self) -> None:
        if not self.ended and self._held:
            self.stop()
            self._worker._abandoned = self
        self._release()

    def _receive(self, timeout_s: float | None) -> tuple | None:
        self._check_stop()
        worker, left_s = self._worker, self._deadline_s - time.monotonic()
        try:
            if left_s <= 0:
                worker._discard()  # it did not answer: the next job starts a fresh one
                return "error", self._stopped
            wait_s = left_s if timeout_s is None else min(timeout_s, left_s)
            if not worker._conn.poll(None if wait_s == float("inf") else wait_s):
                return None
            kind, payload = worker._receive()
            if kind in ("ready", "failed"):
                worker._take_status((kind, payload))
            elif kind == "error" and self._stopped and isinstance(payload, RunStopped):
                payload = self._stopped  # the page's reason (Stop, the time limit)
            elif kind == "progress" and self._stopped:
                kind = "stopped"  # not handed on
            return kind, payload
        except Exception as exc:  # the process died, or its model failed to load
            return "error", exc

    def _check_stop(self) -> None:
        if self._stopped is not None:
            return
        try:
            self._control.check()
        except RunStopped as exc:
            self._stopped = type(exc)(str(exc))
            self._stop_event.set()  # the worker's control raises at its next step
            self._deadline_s = time.monotonic() + STOP_GRACE_S

    def _answered(self) -> None:
        self._release()

    def _release(self) -> None:
        if self._held:
            self._held = False
            self._worker._lock.release()


def _start_without_main(process) -> None:
    """Start ``process`` without the page's main module: spawn runs the parent's main script again
    as ``__mp_main__``, which would load the whole page; a spec named ``__main__`` is skipped as for
    ``python -m``, and put back once the child's start data is taken."""
    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)
    try:
        process.start()
    finally:
        main.__spec__ = spec
