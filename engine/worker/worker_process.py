"""Where the engines run: one worker interface, two transports (a thread here, or a process).

A run's engine work is a job ``fn(model, *args, watch)``: a module-level function with core types
in and out (``comparison``, ``model_facts``), run on the model that holds the weights
(``worker_model``). ``worker.run(fn, args, control, take)`` runs it and hands each engine's
progress to ``take(EngineProgress)`` as it goes; ``control`` (the run's ``RunControl``) ends it
within one step or wait. Two workers answer it:

- ``ThreadWorker(model)``: a model in this process (the page's ``SharedModel``), on the engine
  thread (ZeroGPU, ``CBP_ENGINE_PROCESS=off``, tests).
- ``ProcessWorker(spec, cpus)``: a process of its own that loads the model (``ModelSpec``) on
  CPUs of its own (``pin_process``), so the page's per-session Python, which holds the GIL the
  engines need between torch calls, never slows a run (docs/measurements.md, "Does the room slow
  the run being measured?"). It imports core modules only::

    page ──(fn, args, time limit, time left)─────────▶ worker
    page ◀──("progress", EngineProgress)─────────────── worker   per engine: every 0.5 s, and
    page ◀──("done", value) or ("error", exception)──── worker   when a request finishes

  The page's stop event stops its control too. Exceptions cross as they are (type and message;
  tracebacks stay behind). A process that dies fails its run with ``EngineProcessLost``, and the
  next run starts a fresh one.

Every torch call runs on one thread per process, ``ENGINE_THREAD`` (the page's) or the worker
process's main thread (which ``adopt``s the role), so torch's CPU kernels keep one OpenMP pool, not
one per thread that starts parallel work (what a second pool costs: ``engine.model.openmp_env``).
"""

from __future__ import annotations

import faulthandler
import importlib
import importlib.machinery
import math
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from engine.serving.run_control import RunControl, RunStopped
from engine.worker import progress
from engine.worker.progress import ProgressLog, Take

POLL_S = 0.05  # the page checks its RunControl this often while it waits for the worker
STOP_GRACE_S = 30.0  # a stopped worker answers within a step; past this it is ended


# --- the engine thread ---------------------------------------------------------------------------


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
        """Make the calling thread the engine thread, so ``call`` runs directly on it (the worker
        process's main thread: ``in_dtype`` and the loads then stay on it and its one OpenMP
        pool). Nothing may ``submit`` afterwards (no loop serves the queue)."""
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


# --- the worker interface and its in-process transport -------------------------------------------


class Worker(Protocol):
    """Where a run's engine jobs go (see the module docstring)."""

    def run(self, fn: Callable, args: tuple, control: RunControl, take: Take) -> Any:
        """``fn(model, *args, watch)`` on the model with the weights; its value.

        Raises:
            RunStopped: ``control`` stopped the run (``EngineProcessLost``: the process died).
            Exception: whatever ``fn`` raised, same type and message.
        """
        ...


class ThreadWorker:
    """The worker in this process: ``model`` (the page's ``SharedModel``) on ``ENGINE_THREAD``."""

    def __init__(self, model: Any):
        self.model = model

    def run(self, fn: Callable, args: tuple, control: RunControl, take: Take) -> Any:
        """``Worker.run`` on the engine thread (directly when called there)."""
        return ENGINE_THREAD.call(fn, self.model, *args, ProgressLog(control, take).watch)


# --- the process transport: the page's end -------------------------------------------------------


class EngineProcessLost(RunStopped):
    """The engine process ended (killed, out of memory) before it answered; the message says
    how, for a person."""


@dataclass(frozen=True)
class ModelSpec:
    """What the worker process loads: the model a module-level ``load(spec)`` returns
    (``worker_model.load_spec``: ``load_model``'s ``model``, ``device`` and ``dtype``)."""

    load: Callable[[ModelSpec], Any]
    model: str | None = None
    device: str | None = None
    dtype: str | None = None
    # modules the jobs' functions live in, imported before the worker says it is ready, so the
    # first run does not wait for them (the page's: ``engine.worker.comparison``, ``model_facts``)
    preload: tuple[str, ...] = ()


class ProcessWorker:
    """The page's end of one worker process, started with multiprocessing's *spawn* context (a
    fork would copy a process whose torch and OpenMP threads exist, with locks held by threads
    the child does not have), without the page's main script (``_start_without_main``). One
    run at a time."""

    def __init__(self, spec: ModelSpec, cpus: tuple[int, ...] | None = None):
        self.spec = spec
        self.cpus = cpus  # the worker's CPUs, a torch thread each (pin_process); None: the page's
        self._context = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()  # held by the run in progress
        self._process = None
        self._conn = None
        self._stop = None
        self._ready = False
        self._busy = False  # a job was sent and its answer has not come

    @property
    def pid(self) -> int | None:
        """The worker's process id, None before the first start."""
        return None if self._process is None else self._process.pid

    def start(self) -> None:
        """Start the worker unless one lives; it loads the model while the caller goes on."""
        with self._lock:
            self._start()

    def wait_ready(self) -> None:
        """Start the worker unless one lives, and wait until its model is loaded and warm.

        Raises:
            EngineProcessLost: the worker ended first.
            Exception: the model failed to load in the worker (its exception).
        """
        with self._lock:
            self._start()
            self._await_ready(RunControl())

    def run(self, fn: Callable, args: tuple, control: RunControl, take: Take) -> Any:
        """``Worker.run`` in the worker process (started first if none lives)."""
        with self._lock:
            self._start()
            try:
                self._await_ready(control)
                self._stop.clear()
                self._conn.send((fn, args, control.time_limit_s, control.time_left_s()))
                self._busy = True  # until its answer arrives
                return self._await_result(control, take)
            finally:
                if self._busy:  # the page gave up on a job that goes on: end the worker
                    self._discard()

    def close(self) -> None:
        """End the worker (the page stops)."""
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

    def _await_ready(self, control: RunControl) -> None:
        """Wait for the worker's model (stoppable).

        Raises:
            Exception: the model failed to load in the worker (its exception).
        """
        while not self._ready:
            if self._conn.poll(POLL_S):
                kind, payload = self._receive()
                if kind == "failed":
                    self._discard()
                    raise payload
                self._ready = kind == "ready"
            elif not self._process.is_alive():
                raise self._lost()
            control.check()

    def _await_result(self, control: RunControl, take: Take) -> Any:
        """Hand the job's progress to ``take`` until its answer; once ``control`` stops the run,
        stop the worker's job (and end the worker if it does not answer in time)."""
        stopped: RunStopped | None = None
        deadline_s = math.inf
        while True:
            if self._conn.poll(POLL_S):
                kind, payload = self._receive()
                if kind == "done":
                    self._busy = False
                    return payload
                if kind == "error":
                    self._busy = False
                    raise stopped if stopped and isinstance(payload, RunStopped) else payload
                if stopped is None:
                    take(payload)
            elif not self._process.is_alive():
                raise self._lost()
            if stopped is None:
                try:
                    control.check()
                except RunStopped as exc:
                    stopped = type(exc)(str(exc))
                    self._stop.set()  # the worker's control raises at its next step
                    deadline_s = time.monotonic() + STOP_GRACE_S
            if time.monotonic() > deadline_s:
                self._discard()  # it did not answer: the next run starts a fresh one
                raise stopped

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
        self._process, self._conn, self._ready, self._busy = None, None, False, False
        self._stop = None  # its semaphore goes with it (a new worker gets a new event)


def _start_without_main(process) -> None:
    """Start ``process`` without the page's main module in it.

    Spawn runs the parent's main script again in the child (as ``__mp_main__``): for
    ``python app.py`` that loads gradio, plotly and the whole page into the worker, which needs
    none of it (its jobs name their own modules, ``engine.worker.comparison``, and the OpenMP
    settings ``app.py`` makes reach it through the environment). A main module whose spec is
    named ``__main__`` is one spawn leaves alone, as for ``python -m package``; the spec is put
    back once the child's start data is taken.
    """
    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)
    try:
        process.start()
    finally:
        main.__spec__ = spec


# --- the process transport: the worker's side ----------------------------------------------------


def worker_main(spec: ModelSpec, conn, stop_event, cpus: tuple[int, ...] | None = None) -> None:
    """The worker: keep to ``cpus`` (None: the page's), load ``spec``'s model, then answer jobs
    until the page goes (end of file or None). Every torch call happens on this, its main
    thread, with one torch thread per CPU of ``cpus``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the page's to handle: it ends us
    faulthandler.enable()  # a crash in native code says where, in the page's log
    if cpus and pin_process(cpus):  # before any parallel work: its pool has them
        torch.set_num_threads(len(cpus))
    try:
        _serve(spec, conn, stop_event)
    except BaseException as exc:  # said in the page's log: a run only learns that it ended
        print(f"Engine process {os.getpid()} ends: {type(exc).__name__}: {exc}", flush=True)
        raise


def _serve(spec: ModelSpec, conn, stop_event) -> None:
    ENGINE_THREAD.adopt()  # loads of other precisions (in_dtype) stay on this thread too
    try:
        model = spec.load(spec)
        for name in spec.preload:
            importlib.import_module(name)
    except BaseException as exc:  # told to the page, which raises it for the run that waits
        _send(conn, ("failed", exc.with_traceback(None)))
        return
    _send(conn, ("ready", None))
    print(f"Engine process {os.getpid()} ready: {model.label}", flush=True)
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):  # the page is gone
            return
        if job is None:
            return
        _send(conn, _answer(model, job, conn, stop_event))


def _answer(model, job: tuple, conn, stop_event) -> tuple:
    """Run one job: ``("done", value)`` or ``("error", exception)``."""
    fn, args, time_limit_s, time_left_s = job
    control = RunControl(time_limit_s, time_left_s, stop=stop_event)  # the page's Stop too
    log = ProgressLog(
        control, lambda entry: _send(conn, ("progress", entry)), progress.SNAPSHOT_INTERVAL_S
    )
    try:
        return "done", fn(model, *args, log.watch)
    except BaseException as exc:
        # a fresh stop (the caught one's traceback holds the engines' frames and KV cache)
        stopped = isinstance(exc, RunStopped)
        return "error", type(exc)(str(exc)) if stopped else exc.with_traceback(None)


def _send(conn, message: tuple) -> None:
    """Send ``message``; a value or exception that cannot be pickled is sent as a RuntimeError
    naming it. A closed pipe (the page is gone) ends the worker."""
    try:
        conn.send(message)
    except (BrokenPipeError, EOFError, ConnectionResetError):
        raise SystemExit("the page closed its end of the pipe") from None
    except Exception as exc:  # pickling failed: nothing was written
        what = type(message[1]).__name__
        conn.send(("error", RuntimeError(f"the engine process could not send a {what}: {exc}")))


def pin_process(cpus: tuple[int, ...]) -> bool:
    """Pin every thread of this process to ``cpus`` (threads made later inherit it).

    Returns False, changing nothing more, where the system has no affinity or refuses it.
    """
    if not hasattr(os, "sched_setaffinity"):
        return False
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]  # the calling thread only
    try:
        for thread in threads:
            try:
                os.sched_setaffinity(thread, cpus)
            except ProcessLookupError:  # a thread that ended meanwhile
                continue
    except OSError:
        return False
    return True
