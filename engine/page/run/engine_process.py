"""The engine process: a run's engines in a process of their own, so serving never slows a run.

A run is a measurement, and in one process the page that serves everyone else shares the
interpreter with it: Gradio's per-session Python (about 0.3 s per new session) holds the GIL that
the engine thread needs between its torch calls, so the static engine took 1.3x to 1.5x as long
while nine sessions joined (docs/measurements.md, "Does the room slow the run being measured?").
Two processes have two GILs.

``EngineProcess(spec)`` keeps one worker, started with multiprocessing's *spawn* context (a fork
would copy a process whose torch and OpenMP threads exist, with locks held by threads the child
does not have), without the page's main script (``_start_without_main``: no gradio, no plotly
there). The worker loads the model (``ModelSpec``), warms it up, then runs one job at
a time on its main thread, which makes every torch call (one OpenMP pool: ``engine_thread`` says
why). ``run(fn, args, control, watch)`` calls ``fn(model, *args, watch)`` there: ``fn`` is a
module-level function (pickled by name) and ``model`` the worker's ``SharedModel``::

    page ──(fn, args, time limit, time left)─────────▶ worker
    page ◀──("progress", EngineProgress)─────────────── worker   per engine: every 0.5 s, and
    page ◀──("done", value) or ("error", exception)──── worker   when a request finishes

The page's ``watch(name, None, entry=...)`` (``LiveRun.watch``) takes each progress entry; a trace
travels only when it is a new snapshot (None: the last one holds). Stop, a closed tab and the time
limit: the page's ``RunControl`` is checked between messages; once it raises, the worker's stop
event is set and the worker's own control (the same limit, what is left of it) raises
``RunCancelled`` at its next step; the page then raises its own exception. Exceptions cross as
they are (``ValueError`` keeps its type and message; tracebacks stay behind). A worker that dies
fails its run with ``EngineProcessLost``, and the next run starts a fresh worker. The worker is a
daemon (it ends with the page, SIGTERM included) and ends by itself when the page's end of the
pipe closes.

``CBP_ENGINE_PROCESS`` says whether ``app.py`` uses one: ``engine_process_wanted``.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import importlib
import importlib.machinery
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine import settings
from engine.page.run import cpu_split, shared_model
from engine.page.run.engine_thread import ENGINE_THREAD
from engine.page.run.live_run import SNAPSHOT_INTERVAL_S, LiveRun
from engine.serving.run_control import RunControl, RunStopped

ENV = "CBP_ENGINE_PROCESS"
CHOICES = ("auto", "on", "off")
POLL_S = 0.05  # the page checks its RunControl this often while it waits for the worker
STOP_GRACE_S = 30.0  # a stopped worker answers within a step; past this it is ended


class EngineProcessLost(RunStopped):
    """The engine process ended (killed, out of memory) before it answered; the message says
    how, for a person."""


def engine_process_wanted(environ=None, on_zerogpu: bool = False) -> bool:
    """Whether ``app.py`` runs the engines in an engine process, from ``CBP_ENGINE_PROCESS``:
    ``auto`` (the default: on, except on ZeroGPU, which lends its GPU to the page's own process
    only), ``on``, or ``off`` (the page's engine thread, in the page's process). On by default
    because the engines then get CPUs of their own (``cpu_split``), which a room cannot slow
    (docs/measurements.md, "CPUs of their own").

    Raises:
        ValueError: another value.
    """
    text = settings.value(ENV, environ).lower()
    if text not in CHOICES:
        raise ValueError(f"{ENV}={text!r}: give auto, on or off")
    return text == "on" or (text == "auto" and not on_zerogpu)


@dataclass(frozen=True)
class ModelSpec:
    """What the worker loads: ``load_model``'s arguments (``model``, ``device``, ``dtype``), or,
    when ``load`` is set, the ``SharedModel`` a module-level ``load(spec)`` returns (tests)."""

    model: str | None = None
    device: str | None = None
    dtype: str | None = None
    load: Callable[[ModelSpec], Any] | None = None
    # modules the jobs' functions live in, imported before the worker says it is ready, so the
    # first run does not wait for them (the page's: ``engine.worker.comparison``, ``model_facts``)
    preload: tuple[str, ...] = ()

    def shared(self) -> shared_model.SharedModel:
        """The model, loaded and warmed up (on the calling thread)."""
        if self.load is not None:
            return self.load(self)
        return shared_model.load_and_warm_up(self.model, self.device, self.dtype, calibrate=False)


class EngineProcess:
    """The page's end of one worker; see the module docstring. One run at a time."""

    def __init__(self, spec: ModelSpec, cpus: tuple[int, ...] | None = None):
        self.spec = spec
        self.cpus = cpus  # the worker's CPUs, a torch thread each (cpu_split); None: the page's
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

    def run(self, fn: Callable, args: tuple, control: RunControl, watch: Callable) -> Any:
        """``fn(model, *args, watch)`` in the worker (started first if none lives); its value.

        Raises:
            RunStopped: ``control`` stopped the run (its exception), or the worker's engines did.
            EngineProcessLost: the worker ended before it answered.
            Exception: whatever ``fn`` raised, same type and message.
        """
        with self._lock:
            self._start()
            try:
                self._await_ready(control)
                self._stop.clear()
                self._conn.send((fn, args, control.time_limit_s, control.time_left_s()))
                self._busy = True  # until its answer arrives
                return self._await_result(control, watch)
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

    def _await_result(self, control: RunControl, watch: Callable) -> Any:
        """Relay the job's progress to ``watch`` until its answer; see ``run``."""
        stopped: RunStopped | None = None
        deadline_s = math.inf
        while True:
            if self._conn.poll(POLL_S):
                kind, payload = self._receive()
                if kind in ("done", "error"):
                    self._busy = False
                if kind == "done":
                    return payload
                if kind == "error":
                    raise stopped if stopped and isinstance(payload, RunStopped) else payload
                if stopped is None:
                    try:
                        watch(payload.name, None, entry=payload)
                    except RunStopped as exc:
                        stopped = type(exc)(str(exc))
                continue
            if not self._process.is_alive():
                raise self._lost()
            if stopped is None:
                try:
                    control.check()
                except RunStopped as exc:
                    stopped = type(exc)(str(exc))
            if stopped is not None and deadline_s == math.inf:
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


# --- the worker's side ---------------------------------------------------------------------------


def worker_main(spec: ModelSpec, conn, stop_event, cpus: tuple[int, ...] | None = None) -> None:
    """The worker: keep to ``cpus`` (None: the page's), load ``spec``'s model, then answer jobs
    until the page goes (end of file or None). Every torch call happens on this, its main
    thread, with one torch thread per CPU of ``cpus``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the page's to handle: it ends us
    faulthandler.enable()  # a crash in native code says where, in the page's log
    if cpus and cpu_split.pin_process(cpus):  # before any parallel work: its pool has them
        torch.set_num_threads(len(cpus))
    try:
        _serve(spec, conn, stop_event)
    except BaseException as exc:  # said in the page's log: a run only learns that it ended
        print(f"Engine process {os.getpid()} ends: {type(exc).__name__}: {exc}", flush=True)
        raise


def _serve(spec: ModelSpec, conn, stop_event) -> None:
    """``worker_main``'s body."""
    ENGINE_THREAD.adopt()  # loads of other precisions (in_dtype) stay on this thread too
    try:
        model = spec.shared()
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
    control = _WorkerControl(stop_event, time_limit_s, time_left_s)
    sender = _ProgressSender(conn, control)
    try:
        return "done", fn(model, *args, sender.watch)
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


class _WorkerControl(RunControl):
    """The worker's ``RunControl``: stopped by the page's event too."""

    def __init__(self, stop_event, time_limit_s: float | None, time_left_s: float | None):
        super().__init__(time_limit_s, time_left_s)
        self._stop_event = stop_event

    def check(self) -> None:
        if self._stop_event.is_set():
            self.stop()
        super().check()


class _ProgressSender:
    """The worker's ``watch``: a ``LiveRun`` (never entered) keeps the progress exactly as the
    page's engine thread would; each entry goes to the page when it changed (a new trace
    snapshot, waiting or not, a request finished) and at least every ``SNAPSHOT_INTERVAL_S``
    while steps run. An unchanged trace is sent as None."""

    def __init__(self, conn, control: RunControl):
        self._conn = conn
        self._log = LiveRun(lambda _watch: None, control)
        self._sent: dict[str, tuple] = {}  # engine -> what the page has: (trace id, state)
        self._sent_s: dict[str, float] = {}

    def watch(self, engine: str, trace, done=False, waiting=False, note=None) -> None:
        """``LiveRun.watch``, then the entry to the page if it changed.

        Raises:
            RunStopped: the run should stop.
        """
        self._log.watch(engine, trace, done=done, waiting=waiting, note=note)
        entry = self._log.progress()[engine]
        trace_id = id(entry.trace)  # the log keeps each snapshot alive: ids are not reused
        state = (entry.waiting, entry.note, entry.num_finished, entry.num_requests)
        sent_id, sent_state = self._sent.get(engine, (None, None))
        now_s = time.monotonic()
        due = now_s - self._sent_s.get(engine, -math.inf) >= SNAPSHOT_INTERVAL_S
        if trace_id == sent_id and state == sent_state and not (done or due):
            return
        fresh = trace_id != sent_id or engine not in self._sent
        _send(self._conn, ("progress", entry if fresh else dataclasses.replace(entry, trace=None)))
        self._sent[engine] = (trace_id, state)
        self._sent_s[engine] = now_s
