"""How far a run's engines got, told as they go: ``ProgressLog`` is the ``watch`` a job's engines
call, and ``EngineProgress`` one engine's entry, handed to the run's ``take``."""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.serving.run_control import RunControl
from engine.trace import Trace

SNAPSHOT_INTERVAL_S = 0.5  # trace snapshots per engine: this often, and when a request finishes

Take = Callable[["EngineProgress"], None]


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
    # when it was sent, by ``time.monotonic()`` (the host's clock since boot, on Linux the same in
    # every process), so a page that reads it late still times the steps right
    sent_s: float | None = None


def snapshot(trace: Trace) -> Trace:
    """A copy of ``trace`` later steps cannot change: steps are never changed once appended and
    finished requests get new output lists, so copying the lists and records is enough."""
    return dataclasses.replace(
        trace,
        steps=list(trace.steps),
        requests=[copy.copy(r) for r in trace.requests],
        info=dict(trace.info),
    )


class ProgressLog:
    """The ``watch`` a job's engines call: checks ``control``, keeps each engine's
    ``EngineProgress`` and hands ``send`` a copy at every call, or when changed and at most every
    ``every_s`` (a trace already sent goes as None)."""

    def __init__(self, control: RunControl, send: Take, every_s: float = 0.0):
        self.control = control
        self._send_to = send
        self._every_s = every_s
        self._progress: dict[str, EngineProgress] = {}
        self._snapshot_s: dict[str, float] = {}
        self._sent: dict[str, tuple] = {}  # engine -> what the receiver has: (trace id, state)
        self._sent_s: dict[str, float] = {}

    def watch(
        self,
        engine: str,
        trace: Trace | None,
        done: bool = False,
        waiting: bool = False,
        note: str | None = None,
    ) -> None:
        """Called after each step of ``engine`` (``done`` after its last), and with ``waiting``
        while it waits (``note``: for what); raises RunStopped when the run should stop."""
        self.control.check()
        entry = self._keep(engine, trace, done, waiting, note)
        trace_id = id(entry.trace)  # the log keeps each snapshot alive: ids are not reused
        state = (entry.waiting, entry.note, entry.num_finished, entry.num_requests)
        sent_id, sent_state = self._sent.get(engine, (None, None))
        now_s = time.monotonic()
        due = now_s - self._sent_s.get(engine, -math.inf) >= self._every_s
        if trace_id == sent_id and state == sent_state and not (done or due):
            return
        fresh = trace_id != sent_id or engine not in self._sent
        self._send_to(
            dataclasses.replace(entry, trace=entry.trace if fresh else None, sent_s=now_s)
        )
        self._sent[engine] = (trace_id, state)
        self._sent_s[engine] = now_s

    def _keep(
        self, engine: str, trace: Trace | None, done: bool, waiting: bool, note: str | None
    ) -> EngineProgress:
        """Count a step (or a wait) of ``engine`` and keep a snapshot of its ``trace`` when due."""
        now_s = time.monotonic()
        entry = self._progress.setdefault(engine, EngineProgress(engine))
        entry.waiting, entry.note = waiting, note
        if done and trace is not None:
            entry.num_steps = len(trace.steps)
        elif not waiting:
            entry.num_steps += 1
        if trace is None:  # the reference or transformers' engine: no trace to show
            return entry
        entry.num_requests = len(trace.requests)
        num_finished = sum(r.finish_s is not None for r in trace.requests)
        newly_finished, entry.num_finished = num_finished != entry.num_finished, num_finished
        due = now_s - self._snapshot_s.get(engine, -math.inf) >= SNAPSHOT_INTERVAL_S
        if done or newly_finished or due:
            entry.trace = snapshot(trace)
            self._snapshot_s[engine] = now_s
        return entry
