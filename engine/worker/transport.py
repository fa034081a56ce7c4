"""One worker interface, two transports: ``ThreadWorker`` (this process's engine thread) and
``worker_process.ProcessWorker``, both through ``answer``; the caller's own loop polls
``Job.wait``. Messages: docs/architecture.md, "One Run, module by module"."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from typing import Any, Protocol

from engine.serving.run_control import RunControl, RunStopped
from engine.worker.engine_thread import ENGINE_THREAD
from engine.worker.progress import ProgressLog, Take

POLL_S = 0.05  # ``run``'s slices: how often a blocking caller's control is checked


class Job:
    """A job under way in a worker: ``wait`` for it, then its ``result``. A transport gives
    ``_receive`` (the next message, or None after ``timeout_s``) and ``stop``."""

    def __init__(self, take: Take):
        self._take = take
        self._answer: tuple | None = None

    @property
    def ended(self) -> bool:
        return self._answer is not None

    def wait(self, timeout_s: float | None) -> bool:
        """Hand progress to ``take`` for up to ``timeout_s`` (None: until the answer); True once
        answered. Raises EngineProcessLost when the worker's process ended first."""
        deadline_s = None if timeout_s is None else time.monotonic() + timeout_s
        while self._answer is None:
            left_s = None if deadline_s is None else max(0.0, deadline_s - time.monotonic())
            message = self._receive(left_s)
            if message is None:
                break
            kind, payload = message
            if kind == "progress":
                self._take(payload)
            elif kind in ("done", "error"):  # else a transport's own ("ready", a stopped run's)
                self._answer = message
                self._answered()
            if left_s == 0.0:
                break
        return self._answer is not None

    def result(self) -> Any:
        """The job's value, once ``wait`` returned True.

        Raises:
            RunStopped: the job was stopped (``EngineProcessLost``: its process died).
            Exception: whatever the job raised, same type and message.
        """
        assert self._answer is not None, "result() before the job answered"
        kind, payload = self._answer
        if kind == "error":
            raise payload
        return payload

    def stop(self) -> None:
        """Stop the job: its engines raise ``RunCancelled`` at their next step or wait."""
        raise NotImplementedError

    def close(self) -> None:
        """The caller is done with the job, answered or not (an unanswered one was stopped)."""

    def _receive(self, timeout_s: float | None) -> tuple | None:
        raise NotImplementedError

    def _answered(self) -> None:
        """The answer came (a transport frees what the job held)."""


class Worker(Protocol):
    """Where a run's engine jobs go."""

    def wait_ready(self) -> None:
        """Block until the model is loaded; raise its load's exception."""
        ...

    def submit(self, fn: Callable, args: tuple, control: RunControl, take: Take) -> Job:
        """Send ``fn(model, *args, watch)`` to the model with the weights; its ``Job``."""
        ...

    def run(self, fn: Callable, args: tuple, control: RunControl, take: Take) -> Any:
        """``submit``, then wait for the job's value; raises as ``Job.result``."""
        ...


def run_to_end(job: Job) -> Any:
    """Wait for ``job``'s answer and close it (for callers that block)."""
    try:
        while not job.wait(POLL_S):
            pass
        return job.result()
    finally:
        job.close()


def answer(model, job: tuple, send: Take, control: RunControl, every_s: float) -> tuple:
    """Run ``(fn, args)`` on ``model``, progress to ``send`` at most every ``every_s``; returns
    ``("done", value)`` or ``("error", exception)``, a stop's exception made fresh (the caught
    one's traceback holds the engines' frames and KV cache)."""
    fn, args = job
    log = ProgressLog(control, lambda entry: send(("progress", entry)), every_s)
    try:
        return "done", fn(model, *args, log.watch)
    except BaseException as exc:
        stopped = isinstance(exc, RunStopped)
        return "error", type(exc)(str(exc)) if stopped else exc.with_traceback(None)


class _ThreadJob(Job):
    """A job on the engine thread: its messages through a queue, its stop the run's control."""

    def __init__(self, model, job: tuple, control: RunControl, take: Take):
        super().__init__(take)
        self._control = control
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        send = self._inbox.put
        ENGINE_THREAD.submit(lambda: send(answer(model, job, send, control, 0.0)))

    def stop(self) -> None:
        self._control.stop()

    def close(self) -> None:
        """Stop an unanswered job and wait (its KV cache freed before the model is given up)."""
        if not self.ended:
            self.stop()
            self.wait(None)

    def _receive(self, timeout_s: float | None) -> tuple | None:
        try:
            return self._inbox.get(timeout=timeout_s)
        except queue.Empty:
            return None


class ThreadWorker:
    """The worker in this process: jobs on ``model`` (a ``WorkerModel``; for the page's
    servers, the page's model) run on ``ENGINE_THREAD``."""

    def __init__(self, model: Any):
        self.model = model

    def wait_ready(self) -> None:
        """Ready at once: ``model`` is loaded."""

    def submit(self, fn: Callable, args: tuple, control: RunControl, take: Take) -> Job:
        return _ThreadJob(self.model, (fn, args), control, take)

    def run(self, fn: Callable, args: tuple, control: RunControl, take: Take) -> Any:
        """``Worker.run`` on the engine thread (directly when called there)."""
        if ENGINE_THREAD.on_it():
            return fn(self.model, *args, ProgressLog(control, take).watch)
        return run_to_end(self.submit(fn, args, control, take))
